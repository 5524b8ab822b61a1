package outbox

// Migrations and Install let the external tests install an earlier
// release's schema (every migration but some) and upgrade it.
var (
	Migrations = migrations
	Install    = install
)
