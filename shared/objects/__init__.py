"""pydantic models of keel's database rows and of the values passed between services."""
