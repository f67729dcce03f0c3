"""keel's processes: api, conductor, scheduler, compute, and the keel-manage tool."""
