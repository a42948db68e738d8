package delayproxy

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version, set at build time with
//
//	-ldflags "-X github.com/delayproxy/delayproxy.Version=v1.2.3"
//
// When it is empty, VersionString falls back to the build information.
var Version string

// VersionString is "delayproxy <version> (<go version> <os>/<arch>)", the
// version being Version or, when that is empty, the module version and VCS
// revision from the build information.
func VersionString() string {
	v := Version
	if v == "" {
		v = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok {
			if bi.Main.Version != "" {
				v = bi.Main.Version
			}
			var rev, dirty string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					if s.Value == "true" {
						dirty = "-dirty"
					}
				}
			}
			if rev != "" {
				v += " " + rev[:min(12, len(rev))] + dirty
			}
		}
	}
	return fmt.Sprintf("delayproxy %s (%s %s/%s)", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
