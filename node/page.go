package node

import (
	"embed"
	"io/fs"
	"net/http"
)

// pageFiles are the cluster page's assets, served as they are: no build
// step, nothing fetched from elsewhere.
//
//go:embed page
var pageFiles embed.FS

// mountPage serves the live cluster page at / and its assets under
// /page/.
func mountPage(mux *http.ServeMux) {
	sub, err := fs.Sub(pageFiles, "page")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.FileServerFS(sub)
	mux.Handle("GET /page/", http.StripPrefix("/page/", files))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		w.Header().Set("Referrer-Policy", "no-referrer")
		http.ServeFileFS(w, r, sub, "index.html")
	})
}
