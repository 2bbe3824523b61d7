/**
 * `gateway-upgrade repo set-source proxy|direct`: where the package repository entry fetches from. `proxy` points it
 * at the endpoint file's Proxy, whose repository route relays the real repository (src/proxy/artifacts.ts), for hosts
 * that reach only the Proxy; `direct` points it back at GATEWAY_UPGRADE_APT_REPO_URL / _YUM_REPO_URL. Only the base
 * of the address changes: what follows the base (apt's "/debian", rpm's "/rhel/9/Gateway/$basearch/stable/v17") and
 * every other word of the entry (signed-by, the suite, the channel, gpgkey's path) stay, so the package manager's own
 * signature checks are exactly those of a direct download.
 *
 * The Proxy's certificate chains to the cluster's CA, which the system does not trust. For apt, an apt.conf.d file
 * trusts that CA for the Proxy's host name only (Acquire::https::<host>::CaInfo): no other host's TLS changes. For
 * dnf and yum, `sslcacert=` in the entry's section does the same for that repository only. zypper has no such
 * per-repository setting: the CA must go into the system's store (docs/upgrades.md says so). `direct` removes both.
 *
 * The base of the current address is recognised in this order: the Proxy's repository route (any host), the
 * configured direct URL, else the address's origin (so a path on the mirror is kept).
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { GatewayError } from '../errors.js';
import { PUBLIC_DIR_MODE, writeFileAtomic } from '../fsutil.js';
import { REPO_PATH } from '../wire/artifacts.js';
import { proxyRepoUrl } from './artifacts.js';
import type { Endpoint } from './endpoint.js';
import type { PackageManager } from './packages.js';
import type { RepoEntry } from './repo.js';
import type { UpgraderSettings } from './settings.js';

export type RepoSource = 'proxy' | 'direct';
/** The apt.conf.d file `set-source proxy` writes (read by apt after the distribution's own files). */
export const APT_PROXY_CA_CONF = '60gateway-proxy-ca';

/** The part of an address after its base: the Proxy's route, the direct URL, or the origin. */
export function pathAfterBase(url: string, direct: string): string {
  const route = url.indexOf(`${REPO_PATH}`);
  if (/^https?:\/\//.test(url) && route >= 0 && /^https?:\/\/[^/]+$/.test(url.slice(0, route))) return url.slice(route + REPO_PATH.length);
  if (url === direct || url.startsWith(`${direct}/`)) return url.slice(direct.length);
  const m = /^[a-z][a-z0-9+.-]*:\/\/[^/]*(.*)$/i.exec(url);
  if (!m) throw new GatewayError('GW_ERR_UPGRADE_REPO', `the repository address ${JSON.stringify(url)} is not a URL`);
  return m[1]!;
}

/** The entry's text with its first address (apt: the deb line's URI; rpm: baseurl and gpgkey) moved to base. */
export function moveEntry(entry: Pick<RepoEntry, 'kind' | 'text'>, base: string, direct: string): string {
  let moved = false;
  const lines = entry.text.split('\n').map((line) => {
    if (entry.kind === 'apt') {
      if (moved || line.trim().startsWith('#')) return line;
      const m = /^(\s*deb\s+(?:\[[^\]]*\]\s+)?)(\S+)(.*)$/.exec(line);
      if (!m) return line;
      moved = true;
      return `${m[1]}${base}${pathAfterBase(m[2]!, direct)}${m[3]}`;
    }
    const m = /^(\s*(?:baseurl|gpgkey)\s*=\s*)(\S+)(.*)$/.exec(line);
    if (!m || !/^https?:\/\//.test(m[2]!)) return line;
    moved = true;
    return `${m[1]}${base}${pathAfterBase(m[2]!, direct)}${m[3]}`;
  });
  if (!moved) throw new GatewayError('GW_ERR_UPGRADE_REPO', 'the repository entry has no address to move (no deb line, or no http(s) baseurl)');
  return lines.join('\n');
}

/** rpm: sslcacert= in the first section, set (proxy) or removed (direct). */
export function withSslCaCert(text: string, caFile: string | undefined): string {
  const lines = text.split('\n').filter((l) => !/^\s*sslcacert\s*=/.test(l));
  if (caFile === undefined) return lines.join('\n');
  const at = lines.findIndex((l) => /^\s*baseurl\s*=/.test(l));
  lines.splice(at < 0 ? 1 : at + 1, 0, `sslcacert=${caFile}`);
  return lines.join('\n');
}

/** The apt.conf.d file's text: the cluster CA for the Proxy's host only. */
export function aptCaConf(host: string, caFile: string): string {
  if (!/^[A-Za-z0-9.-]+$/.test(host)) {
    throw new GatewayError('GW_ERR_UPGRADE_REPO', `apt cannot be told a CA for the host ${JSON.stringify(host)}`, { hint: 'Name the Proxy by its DNS name in the endpoint file.' });
  }
  if (/["\n]/.test(caFile)) throw new GatewayError('GW_ERR_UPGRADE_REPO', `the CA file path ${JSON.stringify(caFile)} cannot be written into an apt configuration`);
  return `// Written by gateway-upgrade repo set-source proxy: the gateway repository comes through the Proxy ${host},\n// whose certificate chains to the cluster's CA; trusted for that host only.\nAcquire::https::${host}::CaInfo "${caFile}";\n`;
}

export interface SourceMove {
  path: string;
  text: string;
  /** apt's CA file (proxy) or the file to remove (direct). */
  aptConf?: { path: string; text: string | undefined };
}

/** What `set-source` writes, computed from the current entry (pure but for the paths it names). */
export function planSource(pm: PackageManager, entry: RepoEntry, source: RepoSource, endpoint: Endpoint, s: Pick<UpgraderSettings, 'aptRepoUrl' | 'yumRepoUrl' | 'aptConfDir' | 'hostCaFile'>, caFile?: string): SourceMove {
  const direct = pm === 'apt' ? s.aptRepoUrl : s.yumRepoUrl;
  const base = source === 'proxy' ? proxyRepoUrl(endpoint) : direct;
  const ca = source === 'proxy' ? (caFile ?? s.hostCaFile) : undefined;
  let text = moveEntry(entry, base, direct);
  if (pm !== 'apt' && pm !== 'zypper') text = withSslCaCert(text, ca);
  const move: SourceMove = { path: entry.path, text };
  if (pm === 'apt') move.aptConf = { path: join(s.aptConfDir, APT_PROXY_CA_CONF), text: ca === undefined ? undefined : aptCaConf(endpoint.host, ca) };
  return move;
}

/** Writes a planned move: the entry atomically, then apt's CA file (or its removal). */
export async function applySource(move: SourceMove): Promise<void> {
  try {
    writeFileAtomic(move.path, move.text, { mode: 0o644, dirMode: PUBLIC_DIR_MODE });
    if (move.aptConf?.text !== undefined) writeFileAtomic(move.aptConf.path, move.aptConf.text, { mode: 0o644, dirMode: PUBLIC_DIR_MODE });
    else if (move.aptConf) await rm(move.aptConf.path, { force: true });
  } catch (err) {
    throw new GatewayError('GW_ERR_UPGRADE_REPO', `cannot write the repository source (${(err as NodeJS.ErrnoException).code ?? 'error'})`, { cause: err });
  }
}
