"""examples/langgraph-server as a module, so `langgraph dev` finds it from any working
directory: `langgraph.json` names `vfsd_server_example.agent` (see agent.py)."""
