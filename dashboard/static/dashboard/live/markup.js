// The job frame's `html` (the server's rendering of dashboard/_job_live.html) goes onto the page without innerHTML:
// it is parsed into an inert document (nothing in one runs or loads: no script, no image, no handler), then built
// again, element by element, from the tags and attributes that partial uses; text stays text. Anything else (a
// script, an image, a style, an event handler, a link off this site) is left out with what it holds. So a frame's
// markup cannot run code or load anything even if the server's escaping, or the socket's origin, were ever wrong.

const TAGS = new Set([
  "a", "b", "br", "code", "dd", "details", "div", "dl", "dt", "em", "h2", "h3", "li", "p", "pre", "section", "small",
  "span", "strong", "summary", "table", "tbody", "td", "th", "thead", "tr", "ul",
]);
const ATTRIBUTES = new Set(["class", "id", "title", "colspan", "rowspan", "scope", "download", "role", "aria-live", "aria-label"]);
const DATA_ATTRIBUTE = /^data-[a-z0-9-]+$/;
const HTML = "http://www.w3.org/1999/xhtml";

/** Replace what `container` holds with the markup `html`, rebuilt from the allowed tags and attributes only. */
export function replaceWithMarkup(container, html) {
  const parsed = new DOMParser().parseFromString(String(html), "text/html");
  container.replaceChildren(...rebuild(parsed.body.childNodes));
}

function rebuild(nodes) {
  const built = [];
  for (const node of nodes) {
    if (node.nodeType === Node.TEXT_NODE) {
      built.push(document.createTextNode(node.data));
    } else if (node.nodeType === Node.ELEMENT_NODE && TAGS.has(node.localName) && node.namespaceURI === HTML) {
      const element = document.createElement(node.localName);
      for (const { name, value } of node.attributes) {
        if (ATTRIBUTES.has(name) || DATA_ATTRIBUTE.test(name) || (name === "href" && onThisSite(value))) {
          element.setAttribute(name, value);
        }
      }
      element.append(...rebuild(node.childNodes));
      built.push(element);
    }
  }
  return built;
}

function onThisSite(href) {
  try {
    const url = new URL(href, location.href);
    return url.origin === location.origin && (url.protocol === "http:" || url.protocol === "https:");
  } catch {
    return false;
  }
}
