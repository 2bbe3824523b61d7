/**
 * The version server's contract, shared by the Proxy that serves it (src/proxy/versions.ts) and the upgraders
 * that ask it (src/upgrade/: the endpoint file, the systemd/package upgrader, the Kubernetes updater):
 *
 *   GET|HEAD <VERSION_SERVER_PREFIX><channel>/version   → 200 text/plain "v17.0.1"
 *   GET|HEAD <VERSION_SERVER_PREFIX><channel>/critical  → 200 text/plain "yes" | "no"
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

/** "yes" / "no" (case and surrounding whitespace ignored), or undefined for anything else. */
export function parseCritical(text: string): 'yes' | 'no' | undefined {
  const t = text.trim().toLowerCase();
  return t === 'yes' || t === 'no' ? t : undefined;
}
