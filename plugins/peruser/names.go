package peruser

import (
	"encoding/hex"
	"fmt"
	"regexp"
)

// DBName is the private database of a user: the prefix and the lowercase
// hex of each UTF-8 byte of the name, two digits per byte. CouchDB's
// couch_peruser writes bytes below 0x10 with one digit, which makes
// names ambiguous ("\x01\x23" and "\x12\x03" both give "123"); couchjobs
// pads them. The two agree on every name without control characters; see
// README.md for migrating the others.
func DBName(prefix, user string) string { return prefix + hex.EncodeToString([]byte(user)) }

// dbPrefix is what a database name may start with: CouchDB's rule for
// names (a lowercase letter, then a-z, 0-9, _ $ ( ) + - /).
var dbPrefix = regexp.MustCompile(`^[a-z][a-z0-9_$()+/-]*$`)

func checkPrefix(p string) error {
	if !dbPrefix.MatchString(p) {
		return fmt.Errorf("%q is not a valid database-name prefix: start with a lowercase letter, then use a-z, 0-9, _ $ ( ) + - /", p)
	}
	return nil
}

// userPrefix starts the id of every user document.
const userPrefix = "org.couchdb.user:"
