package sdk

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"

	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// Route is an endpoint of the host's HTTP API that the plugin serves: the
// host forwards matching requests to Handler, in the plugin's process.
// Use it for a job type's own API (say, CouchDB's POST /_replicate).
type Route struct {
	// Pattern is a net/http ServeMux pattern, such as "POST /_replicate"
	// or "GET /_scheduler/docs/{db...}". The host's own endpoints win.
	Pattern string
	// Admin routes are answered only for the host's admins; the host
	// refuses other callers with 401.
	Admin bool
	// Handler answers. Its response is buffered and sent back whole, so
	// a handler that waits (for a job to finish, say) answers once at the
	// end. Caller tells who sent the request.
	Handler http.Handler
}

type callerKey struct{}

// Caller is who sent a forwarded request: the name the host verified
// ("" for an anonymous caller) and whether it is one of the host's admins.
type Caller struct {
	User  string
	Admin bool
}

// RequestCaller returns the caller of a request the host forwarded.
func RequestCaller(r *http.Request) Caller {
	c, _ := r.Context().Value(callerKey{}).(Caller)
	return c
}

// routes builds the plugin's mux; a bad or duplicate pattern is an error.
func (p *Plugin) routes() (mux *http.ServeMux, err error) {
	mux = http.NewServeMux()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("routes: %v", r)
		}
	}()
	for _, r := range p.Routes {
		if r.Handler == nil {
			return nil, fmt.Errorf("route %q has no handler", r.Pattern)
		}
		mux.Handle(r.Pattern, r.Handler)
	}
	return mux, nil
}

func (s *server) ServeHTTP(ctx context.Context, req *pluginv1.HTTPRequest) (*pluginv1.HTTPResponse, error) {
	if s.mux == nil {
		return &pluginv1.HTTPResponse{Status: http.StatusNotFound, Body: []byte(`{"error":"not_found","reason":"the plugin serves no routes"}`)}, nil
	}
	u := &url.URL{RawQuery: req.Query}
	if p, err := url.PathUnescape(req.Path); err == nil {
		u.Path, u.RawPath = p, req.Path
	} else {
		u.Path = req.Path
	}
	ctx = context.WithValue(ctx, callerKey{}, Caller{User: req.User, Admin: req.Admin})
	r, err := http.NewRequestWithContext(ctx, req.Method, u.String(), bytes.NewReader(req.Body))
	if err != nil {
		return nil, fmt.Errorf("forwarded request: %w", err)
	}
	r.URL = u
	r.RequestURI = u.RequestURI()
	for k, v := range req.Headers {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	s.mux.ServeHTTP(w, r)
	resp := w.Result()
	body, _ := io.ReadAll(resp.Body)
	out := &pluginv1.HTTPResponse{Status: int32(resp.StatusCode), Body: body, Headers: map[string]string{}}
	for k := range resp.Header {
		out.Headers[k] = resp.Header.Get(k)
	}
	return out, nil
}
