-- Runs once, when the postgres container initialises an empty data directory (docker-entrypoint-initdb.d).
-- Keycloak keeps its own database beside the platform's; the platform schema is created by the
-- migration step (migrate service), never here.
CREATE DATABASE keycloak;
