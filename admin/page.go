package admin

import (
	"bytes"
	"embed"
	"net/http"
	"path"
	"time"
)

// The status page: GET / and its assets under /ui/, embedded in the binary.
// They hold no data, so they are served without the token; the page reads
// /api/ with it (see ui/status.js) and /readyz. A strict Content Security
// Policy lets the page load only its own scripts and styles and talk only
// to this server.

//go:embed ui
var uiFiles embed.FS

// pageAssets are the files served, by URL path, with their content types.
var pageAssets = map[string]string{
	"/":               "ui/index.html",
	"/ui/status.css":  "ui/status.css",
	"/ui/status.js":   "ui/status.js",
	"/ui/favicon.svg": "ui/favicon.svg",
}

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// pageRoutes adds the page and its assets to mux.
func pageRoutes(mux *http.ServeMux) {
	for urlPath, file := range pageAssets {
		body, err := uiFiles.ReadFile(file)
		if err != nil {
			panic("admin: embedded asset missing: " + file) // caught by every test
		}
		ctype := contentTypes[path.Ext(file)]
		pattern := "GET " + urlPath
		if urlPath == "/" {
			pattern = "GET /{$}"
		}
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Content-Type", ctype)
			h.Set("Content-Security-Policy", pageCSP)
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("X-Frame-Options", "DENY")
			h.Set("Referrer-Policy", "no-referrer")
			h.Set("Cache-Control", "no-cache")
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
		})
	}
}
