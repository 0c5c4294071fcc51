// Package defaults fills the fields of a job's config that were left unset.
package defaults

// Set sets *v to d when it is zero or negative: a config field left unset
// takes its default.
func Set[T ~int | ~int64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
