"""The contracts both sides of the product import: plain Python, no Django, no TensorFlow.

The wire protocol between agents and the orchestrator (`protocol`), strategy names, task types and the TF_CONFIG
rules (`strategies`), the built-in program catalogue and run-config validation (`programs`, `run_config`), the
batch-size and learning-rate rules (`batching`), name rules (`names`), limits both sides enforce (`limits`) and a
log line as a terminal shows it (`terminal_text`).
One definition of each rule: the orchestrator, the dashboard and the agent read it from here.
"""
