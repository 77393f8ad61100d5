"""Network namespaces for integration tests: hosts on a switched "internet", a NAT router, link cuts."""
