"""Response bodies: each module shapes one resource for a given microversion."""
