package tablesource

// PendingSQL exposes the reads' SQL to the plan test.
func (r *Reader) PendingSQL() (first, after string) { return r.sqlFirst, r.sqlAfter }
