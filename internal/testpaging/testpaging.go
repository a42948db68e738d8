// Package testpaging walks the admin API's cursor-paged lists in tests: GET
// .../messages?limit=N&after=KEY answers one page and next_after, the key
// to ask after for the next page ("" on the last). Every page is held to
// that contract.
package testpaging

import "testing"

// All returns every item of a list, page after page. page(after) fetches
// the page after the key after ("" for the first page) and returns its
// items and its next_after. A page with more than limit items, or whose
// next_after is not its last item's key (key names an item's key), fails
// the test, and so does a list of more than maxPages pages: paging that
// does not end.
func All[M any](t testing.TB, limit, maxPages int, key func(M) string, page func(after string) ([]M, string)) []M {
	t.Helper()
	var all []M
	after := ""
	for n := 1; ; n++ {
		if n > maxPages {
			t.Fatalf("testpaging: paging does not end after %d pages", maxPages)
		}
		items, next := page(after)
		if len(items) > limit {
			t.Fatalf("testpaging: page of %d items with limit=%d", len(items), limit)
		}
		all = append(all, items...)
		if next == "" {
			return all
		}
		if len(items) == 0 || next != key(items[len(items)-1]) {
			t.Fatalf("testpaging: next_after %q is not the page's last key", next)
		}
		after = next
	}
}
