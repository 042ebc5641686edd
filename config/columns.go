package config

// Mapped lists the column names outboxd reads from the table: every mapped
// column, without versio when the table has none.
func (c Columns) Mapped() []string {
	out := []string{c.ID, c.AgregatID, c.Tipus, c.Carrega, c.CreatEn}
	if c.Versio != "" {
		out = append(out, c.Versio)
	}
	return out
}
