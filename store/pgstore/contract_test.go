package pgstore_test

import (
	"testing"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/pgstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// TestContract runs the conformance suite against PostgreSQL, a fresh
// schema per test.
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		schema := teststore.PGSchema(t)
		return func() store.Store { return teststore.OpenPG(t, schema, pgstore.Options{}) }
	})
}
