"""What a launch is built from: agent definitions, configuration, the lenient limit rules and
the launcher that turns a request into a `Launch`.

It must never start a node or talk to one: it only builds requests.
"""
