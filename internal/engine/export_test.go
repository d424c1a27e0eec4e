package engine

// DueSQL is the idle probe's statement (Due), for tests that read its plan.
func (s *Engine) DueSQL() string { return s.q.due }

// UnservedSQL is UnservedPending's statement, for tests that read its plan.
func (s *Store) UnservedSQL() string { return unservedSQL(s.q.table) }
