/**
 * What the upgrader asks the Proxy, always through the Dialer (so HTTPS_PROXY / HTTP_PROXY / NO_PROXY apply):
 *
 *   GET https://<endpoint>/version    → "v17.0.2"        the channel's target version
 *   GET https://<endpoint>/critical   → "yes" | "no"     whether it may skip the maintenance window
 *   GET https://<host:port>/webapi/ping → {server_version} whether the cluster can drive automatic upgrades
 *
 * The server certificate is checked against the system's CAs plus the agent's stored cluster CA and any
 * GATEWAY_UPGRADE_CA_FILE (settings.caFiles), for its chain and the endpoint's name. One issued by the cluster's
 * CA (it bears the gateway identity) must also be a Proxy's host certificate: every agent's chains to the same CA
 * and may hold any name its join asked for, so without the role an agent's certificate served under the Proxy's
 * name would choose the version to install. One from a public CA or the operator's own has no role to check and
 * is taken on chain and name (client/api.ts memberOrOutsideServerIdentity).
 */
import { readFileSync } from 'node:fs';
import tls from 'node:tls';
import semver from 'semver';
import { fetchThroughDialer } from '../dial/agent.js';
import type { Dialer } from '../dial/dialer.js';
import { isTlsVerifyError } from '../dial/tlsverify.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { memberOrOutsideServerIdentity } from '../client/api.js';
import { PING_PATH } from '../wire/ping.js';
import { isNoVersion, normalizeVersion, parseCritical, PROXY_HEADER } from '../wire/versions.js';
import type { Endpoint } from './endpoint.js';

export interface HttpDeps {
  dialer: Dialer;
  /** Extra trusted CAs (PEM); the system's stay trusted. */
  ca?: string[];
  timeoutMs?: number;
}

/** The CA list for https requests: undefined (system only) or the system's plus the extra ones. */
export function trustedCas(extra: readonly string[] | undefined): string[] | undefined {
  if (!extra || extra.length === 0) return undefined;
  return [...tls.rootCertificates, ...extra];
}

/** Reads PEM files (missing files are an error naming them). */
export function loadCaFiles(paths: readonly string[]): string[] {
  return paths.map((p) => {
    try {
      return readFileSync(p, 'utf8');
    } catch (err) {
      throw new GatewayError('GW_ERR_FS_READ', `cannot read the CA file ${p} (${(err as NodeJS.ErrnoException).code ?? 'error'})`, { cause: err });
    }
  });
}

const UPGRADE_UNTRUSTED_HINT =
  "Give the CA that signs the Proxy's certificate with GATEWAY_UPGRADE_CA_FILE (the agent's cluster CA in <data_dir>/host/host-ca.pem is trusted already), or check the host in the endpoint file.";

/** A cluster certificate must be a Proxy's (an agent's under the Proxy's name is refused); a public one is taken on chain and name. */
const proxyOrOutside = memberOrOutsideServerIdentity('proxy');

/**
 * One GET of a Proxy's upgrade endpoints (the identity rule above), bounded: maxBodyBytes, the socket's idle
 * deadline, and the whole request's when `signal` is given.
 */
export async function getFromProxy(url: string, deps: HttpDeps, maxBodyBytes: number, signal?: AbortSignal): Promise<{ status: number; body: string; proxy?: string }> {
  return get(url, deps, maxBodyBytes, signal);
}

async function get(url: string, deps: HttpDeps, maxBodyBytes: number, signal?: AbortSignal): Promise<{ status: number; body: string; proxy?: string }> {
  const ca = trustedCas(deps.ca);
  const r = await fetchThroughDialer(url, {
    dialer: deps.dialer,
    timeoutMs: deps.timeoutMs ?? 15_000,
    maxBodyBytes,
    ...(signal ? { signal } : {}),
    headers: { accept: 'text/plain, application/json' },
    ...(ca ? { ca } : {}),
    tlsPeer: { server: 'proxy', untrustedHint: UPGRADE_UNTRUSTED_HINT, acceptsOperatorRoots: true },
    checkServerIdentity: proxyOrOutside,
  });
  const proxy = r.headers[PROXY_HEADER];
  return { status: r.status, body: r.body.toString('utf8'), ...(typeof proxy === 'string' && proxy ? { proxy: proxy.slice(0, 128) } : {}) };
}

/** "17.0.2" (no leading v) from "v17.0.2\n"; undefined for anything that is not semver. */
export function parseVersionText(text: string): string | undefined {
  return normalizeVersion(text)?.slice(1);
}

export interface Target {
  /** semver, no leading v. */
  version: string;
  critical: boolean;
  /** Set when /critical could not be read (then critical is false). */
  criticalProblem?: string;
  /** The host ID of the Proxy that answered /version (its x-gateway-proxy header), when it said. */
  proxy?: string;
}

/**
 * The version server advertises no version ("none" on /version): upstream's NoNewVersionError, after which its
 * clients do nothing and report no error. Not a failure: the upgraders say so and change nothing.
 */
export interface NoTarget {
  none: true;
  url: string;
  proxy?: string;
}

/** Asks the channel's version and criticality. Throws GW_ERR_UPGRADE_VERSION_SERVER. */
export async function fetchTarget(endpoint: Endpoint, deps: HttpDeps): Promise<Target | NoTarget> {
  const url = `${endpoint.base}/version`;
  let r: { status: number; body: string; proxy?: string };
  try {
    r = await get(url, deps, 4096);
  } catch (err) {
    const e = toGatewayError(err);
    // A certificate problem keeps its own code and the fix for it; anything else is the version server's.
    const code = isTlsVerifyError(e) ? e.code : 'GW_ERR_UPGRADE_VERSION_SERVER';
    throw new GatewayError(code, `cannot ask the version server ${url}: ${e.message}`, { cause: e, details: { url, cause: e.code }, ...(isTlsVerifyError(e) ? { hint: e.hint } : {}) });
  }
  if (r.status !== 200) {
    let detail = '';
    try {
      const j = JSON.parse(r.body) as { error?: { message?: string } };
      if (j.error?.message) detail = `: ${j.error.message}`;
    } catch {
      // not JSON
    }
    throw new GatewayError('GW_ERR_UPGRADE_VERSION_SERVER', `the version server ${url} answered HTTP ${r.status}${detail}${r.proxy ? ` (Proxy ${r.proxy})` : ''}`, {
      details: { url, status: r.status, ...(r.proxy ? { proxy: r.proxy } : {}) },
      ...(r.status === 404 ? { hint: `Check the channel "${endpoint.channel}" in the endpoint file: the Proxy serves default and the channels in proxy_service.automatic_upgrades_channels.` } : {}),
    });
  }
  const version = parseVersionText(r.body);
  if (version === undefined && isNoVersion(r.body)) return { none: true, url, ...(r.proxy ? { proxy: r.proxy } : {}) };
  if (version === undefined) {
    throw new GatewayError('GW_ERR_UPGRADE_VERSION_SERVER', `the version server ${url} answered ${JSON.stringify(r.body.trim().slice(0, 40))}, not a version`, { details: { url } });
  }
  const criticalUrl = `${endpoint.base}/critical`;
  const from = r.proxy ? { proxy: r.proxy } : {};
  try {
    const c = await get(criticalUrl, deps, 4096);
    const critical = c.status === 200 ? parseCritical(c.body) : undefined;
    if (critical !== undefined) return { version, critical: critical === 'yes', ...from };
    const answer = c.body.trim().toLowerCase();
    return { version, critical: false, ...from, criticalProblem: `${criticalUrl} answered ${c.status === 200 ? JSON.stringify(answer.slice(0, 20)) : `HTTP ${c.status}`}; treated as not critical` };
  } catch (err) {
    return { version, critical: false, ...from, criticalProblem: `cannot ask ${criticalUrl} (${toGatewayError(err).message}); treated as not critical` };
  }
}

/** The cluster's server_version from /webapi/ping, or undefined with the reason. Never throws. */
export async function fetchClusterVersion(origin: string, deps: HttpDeps): Promise<{ version: string | undefined; problem?: string }> {
  const url = `${origin}${PING_PATH}`;
  try {
    const r = await get(url, deps, 256 * 1024);
    if (r.status !== 200) return { version: undefined, problem: `${url} answered HTTP ${r.status}` };
    const v = (JSON.parse(r.body) as { server_version?: unknown }).server_version;
    return typeof v === 'string' ? { version: v } : { version: undefined, problem: `${url} has no server_version` };
  } catch (err) {
    return { version: undefined, problem: `cannot ask ${url}: ${toGatewayError(err).message}` };
  }
}

/** The first version number in a command's output ("Gateway v17.0.1 git:..." → "17.0.1"). */
export function versionInOutput(output: string): string | undefined {
  const m = /\bv?(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?)/.exec(output);
  if (!m) return undefined;
  return semver.valid(m[1]!) ?? undefined;
}

/** semver equality, pre-releases included, build metadata ignored. */
export function sameVersion(a: string, b: string): boolean {
  return semver.compare(a, b) === 0;
}
