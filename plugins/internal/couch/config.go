package couch

import (
	"fmt"
	"net/url"
	"regexp"
)

// ServerConfig is a CouchDB server in a plugin's configuration: a name
// for its jobs and admin credentials, in the URL or beside it.
type ServerConfig struct {
	// Name names the server in job ids; letters, digits, '.', '_', '-'.
	Name string `json:"name"`
	// URL is the server's base URL.
	URL string `json:"url"`
	// User and Password are admin credentials, if not in the URL.
	User     string `json:"user"`
	Password string `json:"password"`
}

var serverName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ConfigProblem is a problem with a server entry, at a key relative to
// the entry ("name", "url", or "" for the entry).
type ConfigProblem struct{ Key, Message string }

// Connect checks a list of servers and returns a client of each, by name;
// problems name the entry's index and key.
func Connect(servers []ServerConfig, o Options) (map[string]*Client, []ConfigProblem) {
	var problems []ConfigProblem
	bad := func(key, format string, args ...any) {
		problems = append(problems, ConfigProblem{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	clients := map[string]*Client{}
	for i, s := range servers {
		key := fmt.Sprintf("servers.%d", i)
		if !serverName.MatchString(s.Name) {
			bad(key+".name", "%q: use 1 to 63 letters, digits, '.', '_' or '-'", s.Name)
		} else if clients[s.Name] != nil {
			bad(key+".name", "%q is used twice", s.Name)
		}
		c, err := New(s.URL, o)
		if err != nil {
			bad(key+".url", "%v", err)
			continue
		}
		if s.User != "" {
			c = c.WithBasicAuth(s.User, s.Password)
		} else if u, _ := url.Parse(s.URL); u.User == nil {
			bad(key, "no admin credentials: put them in the url or set user and password")
		}
		clients[s.Name] = c
	}
	return clients, problems
}
