// Package intake is "releases first": it holds back the storing of new
// delayed publishes while releases run late, so that an intake burst does
// not take the cores (and the disk) that due messages need.
//
// A Gate is a window of messages that may be in Puts at once, across all
// client connections. The release pipeline tells it, for each confirmed
// release, how late that release was written (Observe); connections'
// storers take room in the window before each Put (Acquire) and give it
// back once the Put returned (Release). The window is AIMD, as TCP's:
//
//   - a release later than the Gate's target cuts it to the messages
//     actually in Puts times target/(2 x lateness): by half just past the
//     target, deeper the later the release; at most once per CutEvery and
//     never below MinWindow;
//   - each release on time widens it by one, up to MaxWindow;
//   - when no release was observed for IdleAfter, it opens to MaxWindow:
//     with nothing to release there is nothing to yield to.
//
// Invariants: a storer always gets room for at least one message once the
// Puts in flight return (the window never closes), so intake slows but
// never stops; Release gives back exactly what Acquire granted; nothing is
// refused or reordered by the Gate, only delayed.
package intake
