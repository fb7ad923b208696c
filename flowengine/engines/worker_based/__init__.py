"""The worker-based engine: tasks run on remote workers reached through kombu.

Submodules: protocol (messages, schemas, request state machine), proxy
(publish/consume over kombu), dispatcher, endpoint, server, worker (the
worker side), executor, types, engine (the executor side). Importing this
package imports nothing heavy; import the submodule you need.
"""
