"""What the tests share besides fixtures: a server in a subprocess, a throwaway PostgreSQL cluster, a recording MCP
server, the page's answers to a question, the session item kinds, the online tests' scripts, the load test's mix
of calls. Imported as `support.<module>` (tests/ is on the path of every test module and of the scripts that reuse
these)."""
