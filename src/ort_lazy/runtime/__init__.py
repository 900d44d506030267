"""ORT sessions, kernel registry and flavour detection."""
