"""Environment folders, one per env, each with a manifest.toml (see trace_gym.registry).

No code here: env.py files of synthesized envs are untrusted and never imported
by the host; they run only inside a sandbox worker.
"""
