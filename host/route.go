package host

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"

	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// Plugins serve endpoints of the node's API (sdk.Route): a request no
// endpoint of the host's own matches goes to the running plugin whose
// route matches it, as a ServeHTTP call.

// buildRoutes makes the mux of a plugin's declared routes. A pattern
// net/http refuses, or one another plugin of the node declared, is a
// permanent error: the configuration (the set of plugins) must change.
func (p *plugin) buildRoutes(desc *pluginv1.DescribeResponse) (mux *http.ServeMux, err error) {
	if len(desc.Routes) == 0 {
		return nil, nil
	}
	for _, other := range p.n.plugins {
		if other == p {
			continue
		}
		other.mu.Lock()
		od := other.desc
		other.mu.Unlock()
		if od == nil {
			continue
		}
		for _, r := range desc.Routes {
			if slices.Contains(mergedRoutes, r.Pattern) {
				continue
			}
			if slices.ContainsFunc(od.Routes, func(o *pluginv1.Route) bool { return o.Pattern == r.Pattern }) {
				return nil, permanent("plugin %s: route %q is plugin %s's too", p.name, r.Pattern, other.name)
			}
		}
	}
	mux = http.NewServeMux()
	defer func() {
		if r := recover(); r != nil {
			mux, err = nil, permanent("plugin %s: routes: %v", p.name, r)
		}
	}()
	for _, r := range desc.Routes {
		mux.Handle(r.Pattern, p.forward(r.Admin))
	}
	return mux, nil
}

// mergedRoutes are routes several plugins may serve at once: each
// answers with a JSON array, and the node answers with all of them
// (CouchDB's _active_tasks lists replications and index builds alike).
var mergedRoutes = []string{"GET /_active_tasks"}

// pluginRoute serves a request through the plugin route that matches it.
func (n *Node) pluginRoute(w http.ResponseWriter, r *http.Request) {
	var merged []http.Handler
	for _, p := range n.plugins {
		p.mu.Lock()
		mux := p.routes
		p.mu.Unlock()
		if mux == nil {
			continue
		}
		if h, pattern := mux.Handler(r); pattern != "" {
			if slices.Contains(mergedRoutes, pattern) {
				merged = append(merged, h)
				continue
			}
			h.ServeHTTP(w, r)
			return
		}
	}
	if len(merged) > 0 {
		n.mergeRoute(w, r, merged)
		return
	}
	writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
}

// mergeRoute concatenates the JSON arrays the plugins answer; a plugin
// that fails is left out (and logged) rather than failing the list.
func (n *Node) mergeRoute(w http.ResponseWriter, r *http.Request, hs []http.Handler) {
	all := []json.RawMessage{}
	for _, h := range hs {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r.Clone(r.Context()))
		var part []json.RawMessage
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &part) != nil {
			if rec.Code == http.StatusUnauthorized {
				copyResponse(w, rec)
				return
			}
			n.log.Warn("a plugin's part of a merged route failed", "path", r.URL.Path, "status", rec.Code)
			continue
		}
		all = append(all, part...)
	}
	writeJSON(w, http.StatusOK, all)
}

func copyResponse(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

// forward sends a request to the plugin and its answer back.
func (p *plugin) forward(admin bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, isAdmin := p.n.caller(r)
		if admin && !isAdmin {
			w.Header().Set("WWW-Authenticate", `Basic realm="couchjobs"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "this endpoint needs an admin's name and password (http.admins in runtime.toml)")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the body is over %d bytes", maxBody))
			return
		}
		p.mu.Lock()
		c := p.client
		p.mu.Unlock()
		if c == nil {
			writeError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf("plugin %s is not running on this node", p.name))
			return
		}
		req := &pluginv1.HTTPRequest{
			Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Body: body,
			Headers: map[string]string{}, User: user, Admin: isAdmin,
		}
		for k := range r.Header {
			switch k {
			case "Authorization", "Cookie":
			default:
				req.Headers[k] = strings.Join(r.Header.Values(k), ", ")
			}
		}
		resp, err := c.Plugin.ServeHTTP(r.Context(), req)
		if err != nil {
			if r.Context().Err() != nil {
				return // the caller went away
			}
			p.log.Warn("plugin route failed", "path", r.URL.Path, "error", err)
			writeError(w, http.StatusBadGateway, "plugin_error", fmt.Sprintf("plugin %s: %v", p.name, err))
			return
		}
		for k, v := range resp.Headers {
			w.Header().Set(k, v)
		}
		status := int(resp.Status)
		if status < 100 || status > 999 {
			status = http.StatusBadGateway
		}
		w.WriteHeader(status)
		w.Write(resp.Body)
	})
}

// privateFields are the private data fields of a job type, as its plugin
// declared them.
func (n *Node) privateFields(typ string) []string {
	for _, p := range n.plugins {
		p.mu.Lock()
		d := p.desc
		p.mu.Unlock()
		if d == nil {
			continue
		}
		for _, t := range d.Types {
			if t.Name == typ {
				return t.PrivateFields
			}
		}
	}
	return nil
}
