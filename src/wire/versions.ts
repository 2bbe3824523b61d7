/**
 * The version server's contract, shared by the Proxy that serves it (src/proxy/versions.ts) and the upgraders
 * that ask it (src/upgrade/: the endpoint file, the systemd/package upgrader, the Kubernetes updater):
 *
 *   GET|HEAD <VERSION_SERVER_PREFIX><channel>/version   → 200 text/plain "v17.0.1", or "none" (no target advertised)
 *   GET|HEAD <VERSION_SERVER_PREFIX><channel>/critical  → 200 text/plain "yes" | "no"
 *
 * What is read is what upstream's clients read (docs/version-server.md, "Upstream compatibility"): a critical flag
 * of "true"/"false" as well as "yes"/"no", and "none" for a version server with no target to advertise.
 *
 * Every answer names the Proxy that gave it in PROXY_HEADER. Pure: paths, header names and the parsing of the
 * two answers (documented in docs/version-server.md).
 */
import semver from 'semver';

export const VERSION_SERVER_PREFIX = '/v1/webapi/automaticupgrades/channel/';
/** The channel every Proxy serves (its own version) unless its configuration defines it. */
export const DEFAULT_CHANNEL = 'default';
/** The response header that names the Proxy (its host ID) that answered. */
export const PROXY_HEADER = 'x-gateway-proxy';

export type VersionRequest = 'version' | 'critical';

/**
 * "v1.2.3" for "1.2.3" or "v1.2.3" (surrounding whitespace ignored), or undefined when it is not semver.
 * Build metadata and pre-release parts are kept as written.
 */
export function normalizeVersion(text: string): string | undefined {
  const trimmed = text.trim();
  const bare = trimmed.startsWith('v') ? trimmed.slice(1) : trimmed;
  if (!/^\d/.test(bare) || semver.valid(bare) === null) return undefined;
  return `v${bare}`;
}

/**
 * "yes" / "no" (case and surrounding whitespace ignored), or undefined for anything else. "true" / "false" are
 * read as yes / no too, as upstream's maintenance trigger reads them (upstream's version servers answer either).
 */
export function parseCritical(text: string): 'yes' | 'no' | undefined {
  const t = text.trim().toLowerCase();
  if (t === 'yes' || t === 'true') return 'yes';
  if (t === 'no' || t === 'false') return 'no';
  return undefined;
}

/** What a version server answers on /version when it has no target version to advertise (upstream's NoVersion). */
export const NO_VERSION = 'none';

/** Whether a /version answer is NO_VERSION (surrounding whitespace ignored: a trailing newline is usual). */
export function isNoVersion(text: string): boolean {
  return text.trim() === NO_VERSION;
}
