"""Who is who, at the models' level so that agents/, jobs/, metrics/, the admin and the API all build on it: agent
tokens and the keys derived from them (tokens.py), the control plane's own keys (keys.py), each host's broker user
(broker_users.py), who sent an agent's message, replays refused (auth.py, stream_marks.py), a host speaking only for
its own tasks (foreign.py), and users' API tokens (api_tokens.py).

May import: contracts, limits, models, plumbing. It imports the models, never the reverse."""
