package server

// UnknownKeyIDs are the key IDs that JWTs named under the current policy
// and its JWKS lacks; the push ack reports them so the controller can
// refetch a JWKS URL.
func (s *Server) UnknownKeyIDs() []string {
	st := s.cur.Load()
	if st == nil {
		return nil
	}
	return st.id.UnknownKeyIDs()
}
