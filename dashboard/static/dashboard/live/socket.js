// The job page's one WebSocket: connects, reconnects with backoff from the page's cursor, and tells "not allowed"
// from "server away".
//
// Refusals: the server closes with 4403 when the user may not see the job, but a refusal before the handshake reaches
// a browser only as a failed connection (code 1006), the same as a server that is down. So after a connection that
// never opened, the page asks for its own live partial: 403/404 or a redirect to the login page means "not allowed"
// (and no more tries); a network error or any other answer means the server is away, so it tries again.

const RETRY_FIRST_MS = 500;
const RETRY_MAX_MS = 5000;
const STATUS_TEXT = { connecting: "connecting…", loading: "loading…", live: "live", reconnecting: "reconnecting…" };

/**
 * Open the socket at `path` and keep it open; every connect asks for what comes after the page's cursors, the query
 * string `query()` returns (`since=...&log_since=...`). `onFrame(frame)` gets every parsed frame; `statusEl` shows
 * the status. Returns the connection's counters.
 */
export function keepConnected({ path, probeUrl, query, onFrame, statusEl }) {
  const conn = {
    status: "connecting",
    reconnects: 0,
    connectAttempts: 0,
    framesReceived: 0,
    get retryScheduled() {
      return retryTimer !== null;
    },
    /** A connection that delivered its history counts as a good one: the next retry starts fast again. */
    healthy() {
      retryDelay = RETRY_FIRST_MS;
      setStatus("live");
    },
  };
  let socket = null;
  let everOpened = false;
  let retryDelay = RETRY_FIRST_MS;
  let retryTimer = null;
  let stopped = false;

  function setStatus(status) {
    conn.status = status;
    statusEl.textContent = STATUS_TEXT[status] || status;
    statusEl.dataset.status = status;
  }

  function connect() {
    retryTimer = null;
    if (stopped) return;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    conn.connectAttempts += 1;
    if (conn.connectAttempts === 1) performance.mark("tfdash:socket-connect");
    const ws = new WebSocket(`${scheme}//${location.host}${path}?${query()}`);
    socket = ws;
    let opened = false;
    ws.onopen = () => {
      if (!everOpened) performance.mark("tfdash:socket-open");
      opened = true;
      if (everOpened) conn.reconnects += 1;
      everOpened = true;
      setStatus("loading");
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return; // not ours to show
      }
      conn.framesReceived += 1;
      if (conn.framesReceived === 1) performance.mark("tfdash:first-frame");
      onFrame(frame);
    };
    ws.onclose = (event) => {
      if (socket !== ws) return;
      socket = null;
      if (stopped) return;
      if (event.code === 4403) {
        notAllowed();
      } else if (!opened) {
        probeThenRetry();
      } else {
        retryLater();
      }
    };
  }

  function retryLater() {
    setStatus("reconnecting");
    const jitter = 0.8 + Math.random() * 0.4;
    retryTimer = setTimeout(connect, Math.round(retryDelay * jitter));
    retryDelay = Math.min(retryDelay * 2, RETRY_MAX_MS);
  }

  async function probeThenRetry() {
    setStatus("reconnecting");
    let answer = null;
    try {
      answer = await fetch(probeUrl, { redirect: "manual", cache: "no-store", credentials: "same-origin" });
    } catch {
      answer = null; // the server is away: try again later
    }
    if (stopped) return;
    if (answer && (answer.type === "opaqueredirect" || answer.status === 403 || answer.status === 404)) {
      notAllowed();
    } else {
      retryLater();
    }
  }

  function notAllowed() {
    stopped = true;
    if (retryTimer) clearTimeout(retryTimer);
    retryTimer = null;
    setStatus("not allowed");
  }

  window.addEventListener("online", () => {
    if (retryTimer) {
      clearTimeout(retryTimer);
      connect();
    }
  });
  window.addEventListener("pagehide", () => {
    stopped = true;
    if (retryTimer) clearTimeout(retryTimer);
    retryTimer = null;
    if (socket) socket.close(1000);
  });
  window.addEventListener("pageshow", (event) => {
    if (event.persisted && conn.status !== "not allowed") {
      stopped = false; // back from the back/forward cache: pick up where the page left off
      connect();
    }
  });

  connect();
  return conn;
}
