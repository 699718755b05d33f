"""Host identity, at the models' level so that agents/, control/, metrics/, the admin and the API all build on it:
agent tokens and the keys derived from them (tokens.py), the control plane's own keys (keys.py), each host's broker
user (broker_users.py) and how an agent's message is authenticated (auth.py). It imports the models, never the
reverse."""
