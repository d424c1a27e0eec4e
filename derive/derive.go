package derive

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
)

// Prefix starts every key this package derives. The digit is the version of
// the derivation: a new derivation would take a new prefix, and keys already
// released keep theirs forever.
const Prefix = "sfx1_"

// KeyLen is the length of every derived key: the prefix and 64 hex digits.
const KeyLen = len(Prefix) + 2*sha256.Size

// Domain-separation tags, one per derivation, each hashed first. They are part
// of the released derivation and must never change.
const (
	tagKey      = "sidefx/key/v1"
	tagChild    = "sidefx/child/v1"
	tagDomainID = "sidefx/domain-id/v1"
	tagRevision = "sidefx/revision/v1"
)

// Key returns the idempotency key of the effect of kind caused by sourceID,
// with no namespace. It equals KeyNS("", sourceID, kind).
func Key(sourceID, kind string) string {
	return KeyNS("", sourceID, kind)
}

// KeyNS returns the idempotency key of the effect of kind caused by sourceID
// in namespace. A deployment sets its namespace once (for example
// "staging") so that two deployments sharing one provider account never send
// the same key for different effects. The empty namespace is the default.
//
// The key is Prefix followed by the lowercase hex SHA-256 of the tag
// "sidefx/key/v1", namespace, sourceID and kind, each preceded by its length
// in bytes as a 4-byte big-endian integer. PostgreSQL computes the same value
// with sha256() and int4send(); the migrations install it as sidefx_key.
func KeyNS(namespace, sourceID, kind string) string {
	return digest(tagKey, namespace, sourceID, kind)
}

// Child returns the key of one step of a multi-call effect whose key is key:
// an effect that must call a provider twice (create, then confirm) sends
// Child(key, "create") and Child(key, "confirm"), each stable across retries.
func Child(key, step string) string {
	return digest(tagChild, key, step)
}

// Revision returns the key of revision n (n ≥ 1) of an effect whose
// previous key is key: an operator who supersedes an effect that definitely
// did nothing with a corrected payload sends it under Revision(key, n), so a
// provider that remembers the old key with its refusal (Stripe keeps a card
// decline under its key) takes the corrected request as a new one. Revisions
// chain: revision 2's key is Revision(Revision(k, 1), 2). n is written in
// decimal, without leading zeros.
func Revision(key string, n int) string {
	return digest(tagRevision, key, strconv.Itoa(n))
}

// UUID is a 16-byte identifier in RFC 9562 layout.
type UUID [16]byte

// String returns u in the canonical 8-4-4-4-12 lowercase hex form.
func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:])
}

// MarshalText implements encoding.TextMarshaler with the canonical form.
func (u UUID) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// ParseUUID parses the canonical 8-4-4-4-12 hex form.
func ParseUUID(s string) (UUID, error) {
	var u UUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, fmt.Errorf("parse uuid %q: want the 8-4-4-4-12 hex form", s)
	}
	src := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(u[:], []byte(src)); err != nil {
		return UUID{}, fmt.Errorf("parse uuid %q: %w", s, err)
	}
	return u, nil
}

// DomainID returns a deterministic UUID for a client-supplied key within a
// tenant: an API edge that receives the same request twice (a client retry
// carrying the same clientKey) derives the same domain id, and so the same
// effect keys downstream. The UUID is version 8 (custom) with the RFC 9562
// variant; its other 122 bits are the first bits of the SHA-256 of the tag
// "sidefx/domain-id/v1", tenant and clientKey, length-prefixed as in KeyNS.
func DomainID(tenant, clientKey string) UUID {
	return domainID(sum(tagDomainID, tenant, clientKey))
}

// ScopedDomainID is DomainID for a client key scoped further than its
// tenant: an API edge that keeps a key per method and route (so that a
// client may use one key on two routes for two requests) passes them as
// scope, "POST /orders", and gets one domain id per route. The SHA-256 is
// of the tag "sidefx/domain-id/v1", tenant, clientKey and scope,
// length-prefixed as in KeyNS; an empty scope is left out, so
// ScopedDomainID(tenant, clientKey, "") is DomainID(tenant, clientKey), the
// value released first. Length prefixes keep the scoped and unscoped forms
// apart: no tenant and key give the value of another tenant, key and
// non-empty scope.
func ScopedDomainID(tenant, clientKey, scope string) UUID {
	if scope == "" {
		return DomainID(tenant, clientKey)
	}
	return domainID(sum(tagDomainID, tenant, clientKey, scope))
}

// domainID makes a version 8 UUID of h's first 16 bytes.
func domainID(h [sha256.Size]byte) UUID {
	var u UUID
	copy(u[:], h[:16])
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // variant 10
	return u
}

// Valid reports whether key has the form of a key this package derives.
// It says nothing of which inputs the key was derived from.
func Valid(key string) bool {
	if len(key) != KeyLen || key[:len(Prefix)] != Prefix {
		return false
	}
	for i := len(Prefix); i < len(key); i++ {
		c := key[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func digest(tag string, fields ...string) string {
	h := sum(tag, fields...)
	b := make([]byte, KeyLen)
	copy(b, Prefix)
	hex.Encode(b[len(Prefix):], h[:])
	return string(b)
}

func sum(tag string, fields ...string) [sha256.Size]byte {
	h := sha256.New()
	field(h, tag)
	for _, f := range fields {
		field(h, f)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// field writes s preceded by its length as a 4-byte big-endian integer, the
// encoding of PostgreSQL's int4send(octet_length(s)) || convert_to(s, 'UTF8').
// Inputs longer than 2 GiB cannot reach here from the database, and a Go
// string that long would need more memory than any effect is allowed.
func field(h hash.Hash, s string) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}
