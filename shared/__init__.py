"""Code shared by keel's services: configuration, RPC, database access and models."""
