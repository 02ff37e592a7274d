"""The example agents and workflows shipped with subagents-node (package data, not code to import).

`agents/` holds small agents (scout, summarizer, sleeper, recursive) that the demo, the docs and
the tests run; `workflows/` a workflow script. An installed wheel carries them too, so
`python -m subagents_node.demo` works without a clone: find them with
`Path(subagents_node.examples.__file__).parent / "agents"`.
"""
