/**
 * The Proxy's version server for automatic agent upgrades.
 *
 *   GET|HEAD /v1/webapi/automaticupgrades/channel/<channel>/version   → 200 text/plain "v17.0.1" (no newline)
 *   GET|HEAD /v1/webapi/automaticupgrades/channel/<channel>/critical  → 200 text/plain "yes" | "no"
 *
 * <channel> may contain "/" (stable/v14): the last path segment is the request type, everything between the
 * prefix and it is the channel name. The path is percent-decoded exactly once; empty, "." and ".." segments are
 * refused. `default` always exists (the Proxy's own version) unless the configuration defines it.
 *
 * static_version channels answer their version (critical: "no"). forward_url channels ask
 * <forward_url>/version and <forward_url>/critical through the Dialer (so HTTPS_PROXY / NO_PROXY apply), with a
 * short deadline, and cache each answer for cacheTtlMs per (channel, what); concurrent requests for a missing or
 * expired entry share one upstream fetch. A failed fetch is answered 502 (504 on a timeout) and is never covered
 * by a stale value. Every answer carries Cache-Control: no-store so no agent or intermediary keeps old versions,
 * and x-gateway-proxy: <host ID> naming the Proxy that answered (JSON error bodies also carry "proxy").
 *
 * The paths, the header and the parsing of the answers are the upgraders' too: src/wire/versions.ts.
 * Documented in docs/version-server.md.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { fetchThroughDialer } from '../dial/agent.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, httpStatus, isGatewayError, toGatewayError, type ErrorCode } from '../errors.js';
import { logger } from '../log.js';
import { DEFAULT_CHANNEL, isNoVersion, NO_VERSION, normalizeVersion, parseCritical, PROXY_HEADER, VERSION_SERVER_PREFIX, type VersionRequest } from '../wire/versions.js';

export const VERSION_SERVER_DEFAULTS = Object.freeze({
  cacheTtlMs: 60_000,
  upstreamTimeoutMs: 5_000,
});

/** Upstream answers are a version or yes/no: anything bigger is not a version server. */
const MAX_UPSTREAM_BODY = 4096;

export interface VersionServerOptions {
  /** proxy_service.automatic_upgrades_channels: channel name → exactly one of static_version / forward_url. */
  channels: Readonly<Record<string, { static_version?: string; forward_url?: string }>>;
  /** What `default` serves when the configuration does not define it (src/version.ts VERSION); a leading v is added. */
  ownVersion: string;
  /** For forward_url fetches (HTTPS_PROXY / NO_PROXY apply). */
  dialer: Dialer;
  /** Milliseconds since the epoch; Date.now by default. Only the cache reads it. */
  clock?: () => number;
  /** How long an upstream answer is reused, per (channel, what). Default 60 s. */
  cacheTtlMs?: number;
  /** Deadline for one upstream fetch, connection included. Default 5 s. */
  upstreamTimeoutMs?: number;
  /** Extra CA (PEM) trusted for https upstreams, besides the system's. */
  ca?: string | Buffer;
  /** This Proxy's host ID: every answer names it (x-gateway-proxy header; "proxy" in JSON bodies), to find drift. */
  proxyId?: string;
}

type Channel =
  | { kind: 'static'; version: string }
  | { kind: 'forward'; base: URL; display: string };

interface CacheEntry {
  value: string;
  expiresAt: number;
}

/** Dial / HTTP failures that mean "the upstream did not answer in time". */
const TIMEOUT_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  'GW_ERR_HTTP_TIMEOUT',
  'GW_ERR_DIAL_CONNECT_TIMEOUT',
  'GW_ERR_DIAL_PROXY_NO_ANSWER',
]);

function quote(s: string, max = 80): string {
  return JSON.stringify(s.length > max ? `${s.slice(0, max)}…` : s);
}

export class VersionServer {
  private readonly channels = new Map<string, Channel>();
  private readonly cache = new Map<string, CacheEntry>();
  private readonly inflight = new Map<string, Promise<string>>();
  private readonly clock: () => number;
  private readonly cacheTtlMs: number;
  private readonly upstreamTimeoutMs: number;
  private readonly dialer: Dialer;
  private readonly ca: string | Buffer | undefined;
  private readonly proxyId: string | undefined;
  private readonly log = logger('version-server');

  constructor(options: VersionServerOptions) {
    this.dialer = options.dialer;
    this.clock = options.clock ?? Date.now;
    this.cacheTtlMs = options.cacheTtlMs ?? VERSION_SERVER_DEFAULTS.cacheTtlMs;
    this.upstreamTimeoutMs = options.upstreamTimeoutMs ?? VERSION_SERVER_DEFAULTS.upstreamTimeoutMs;
    this.ca = options.ca;
    this.proxyId = options.proxyId;

    const own = normalizeVersion(options.ownVersion);
    if (own === undefined) throw new GatewayError('GW_ERR_INTERNAL', `the gateway's own version ${quote(options.ownVersion)} is not semver`);
    this.channels.set(DEFAULT_CHANNEL, { kind: 'static', version: own });

    for (const [name, channel] of Object.entries(options.channels)) {
      const where = `proxy_service.automatic_upgrades_channels.${name}`;
      const hasStatic = channel.static_version !== undefined;
      const hasForward = channel.forward_url !== undefined;
      if (hasStatic === hasForward) {
        throw new GatewayError('GW_ERR_CONFIG_CHANNEL', `${where} sets ${hasStatic ? 'both' : 'neither'} static_version ${hasStatic ? 'and' : 'nor'} forward_url`, {
          details: { key: where },
        });
      }
      if (hasStatic) {
        const version = normalizeVersion(channel.static_version!);
        if (version === undefined) {
          throw new GatewayError('GW_ERR_CONFIG_VALUE', `${where}.static_version: expected a version such as v17.0.1, got ${quote(channel.static_version!)}`, {
            details: { key: `${where}.static_version` },
          });
        }
        this.channels.set(name, { kind: 'static', version });
        continue;
      }
      let base: URL;
      try {
        base = new URL(channel.forward_url!);
      } catch {
        throw new GatewayError('GW_ERR_CONFIG_VALUE', `${where}.forward_url is not a URL`, { details: { key: `${where}.forward_url` } });
      }
      if (base.protocol !== 'http:' && base.protocol !== 'https:') {
        throw new GatewayError('GW_ERR_CONFIG_VALUE', `${where}.forward_url must be an http:// or https:// URL`, { details: { key: `${where}.forward_url` } });
      }
      base.hash = '';
      base.pathname = base.pathname.replace(/\/+$/, '');
      const display = `${base.origin}${base.pathname}`; // never the userinfo
      if (/\/(version|critical)$/.test(base.pathname)) {
        this.log.warn({ channel: name, forward_url: display }, 'forward_url ends with /version or /critical; the version server appends that itself');
      }
      this.channels.set(name, { kind: 'forward', base, display });
    }
  }

  /** Names of every channel served, `default` included. */
  channelNames(): string[] {
    return [...this.channels.keys()];
  }

  /**
   * Handles GET/HEAD /v1/webapi/automaticupgrades/channel/<channel>/(version|critical); returns false when the
   * path is not its own (so the web server can try other routes). The answer may be sent after this returns.
   */
  handle(req: IncomingMessage, res: ServerResponse): boolean {
    const raw = (req.url ?? '/').split('?')[0]!;
    const owned = raw === VERSION_SERVER_PREFIX.slice(0, -1) || raw.startsWith(VERSION_SERVER_PREFIX);
    if (!owned) return false;
    req.resume(); // a body (there should be none) is drained, so keep-alive keeps working
    const head = req.method === 'HEAD';
    if (req.method !== 'GET' && !head) {
      this.sendError(res, false, new GatewayError('GW_ERR_API_METHOD_NOT_ALLOWED', `${req.method} is not allowed on the version server`, { hint: 'Use GET (or HEAD).' }), {
        allow: 'GET, HEAD',
      });
      return true;
    }
    let parsed: { channel: string; what: VersionRequest };
    try {
      parsed = parsePath(raw);
    } catch (err) {
      this.sendError(res, head, toGatewayError(err));
      return true;
    }
    this.resolve(parsed.channel, parsed.what).then(
      (value) => this.send(res, head, 200, 'text/plain; charset=utf-8', value),
      (err: unknown) => this.sendError(res, head, toGatewayError(err)),
    ).catch(() => res.destroy());
    return true;
  }

  /** The same decision without HTTP, for the agent-side updater and tests: "v1.2.3" or "yes" / "no". */
  async resolve(channel: string, what: VersionRequest): Promise<string> {
    if (what !== 'version' && what !== 'critical') {
      throw new GatewayError('GW_ERR_VERSION_BAD_PATH', `the request type must be "version" or "critical", got ${quote(String(what))}`);
    }
    const c = this.channels.get(channel);
    if (c === undefined) {
      throw new GatewayError('GW_ERR_VERSION_UNKNOWN_CHANNEL', `no channel ${quote(channel)} on this proxy`, {
        details: { channel },
      });
    }
    if (c.kind === 'static') return what === 'version' ? c.version : 'no';

    const key = `${what}\u0000${channel}`;
    const now = this.clock();
    const hit = this.cache.get(key);
    if (hit && now < hit.expiresAt) return hit.value;
    const pending = this.inflight.get(key);
    if (pending) return pending;
    const fetched = this.fetchUpstream(channel, c, what).then(
      (value) => {
        this.cache.set(key, { value, expiresAt: now + this.cacheTtlMs });
        return value;
      },
      (err: unknown) => {
        this.cache.delete(key); // a stale value must never come back as current
        throw err;
      },
    );
    const shared = fetched.finally(() => this.inflight.delete(key));
    this.inflight.set(key, shared);
    return shared;
  }

  private async fetchUpstream(name: string, c: Extract<Channel, { kind: 'forward' }>, what: VersionRequest): Promise<string> {
    const url = new URL(c.base.href);
    url.pathname = `${c.base.pathname}/${what}`;
    const shown = `${c.display}/${what}`;
    const details = { channel: name, url: shown };
    const controller = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(
          new GatewayError('GW_ERR_VERSION_UPSTREAM_TIMEOUT', `upstream version server ${shown} for channel ${quote(name)} did not answer within ${this.upstreamTimeoutMs} ms`, {
            details,
          }),
        );
        controller.abort();
      }, this.upstreamTimeoutMs);
    });
    const request = fetchThroughDialer(url.href, {
      dialer: this.dialer,
      timeoutMs: this.upstreamTimeoutMs,
      maxBodyBytes: MAX_UPSTREAM_BODY,
      headers: { accept: 'text/plain' },
      signal: controller.signal,
      ...(this.ca === undefined ? {} : { ca: this.ca }),
    });
    request.catch(() => undefined); // settled after the deadline won: nobody is listening any more
    let result: Awaited<typeof request>;
    try {
      result = await Promise.race([request, deadline]);
    } catch (err) {
      if (isGatewayError(err, 'GW_ERR_VERSION_UPSTREAM_TIMEOUT')) throw err;
      const cause = toGatewayError(err);
      const timedOut = TIMEOUT_CODES.has(cause.code);
      throw new GatewayError(
        timedOut ? 'GW_ERR_VERSION_UPSTREAM_TIMEOUT' : 'GW_ERR_VERSION_UPSTREAM',
        `upstream version server ${shown} for channel ${quote(name)} failed: ${cause.message}`,
        { cause, details: { ...details, cause: cause.code } },
      );
    } finally {
      clearTimeout(timer);
    }
    const body = result.body.toString('utf8');
    if (result.status !== 200) {
      throw new GatewayError('GW_ERR_VERSION_UPSTREAM', `upstream version server ${shown} for channel ${quote(name)} answered HTTP ${result.status}`, {
        details: { ...details, status: result.status },
      });
    }
    // "none": the upstream server advertises no version (upstream's NoVersion); passed on as it is, for the
    // upgraders to do nothing, as upstream's do.
    const value = what === 'version' ? (isNoVersion(body) ? NO_VERSION : normalizeVersion(body)) : parseCritical(body);
    if (value === undefined) {
      const expected = what === 'version' ? 'a semver version or "none"' : '"yes", "no", "true" or "false"';
      throw new GatewayError('GW_ERR_VERSION_UPSTREAM', `upstream version server ${shown} for channel ${quote(name)} answered ${quote(body.trim(), 40)}, not ${expected}`, {
        details,
      });
    }
    this.log.debug({ channel: name, what, value }, 'fetched from the upstream version server');
    return value;
  }

  private send(res: ServerResponse, head: boolean, status: number, type: string, body: string, extra: Record<string, string> = {}): void {
    if (res.headersSent || res.destroyed) return; // the client went away
    res.writeHead(status, {
      'content-type': type,
      'content-length': Buffer.byteLength(body),
      'cache-control': 'no-store',
      pragma: 'no-cache',
      'x-content-type-options': 'nosniff',
      ...(this.proxyId === undefined ? {} : { [PROXY_HEADER]: this.proxyId }),
      ...extra,
    });
    if (head) res.end();
    else res.end(body);
  }

  private sendError(res: ServerResponse, head: boolean, err: GatewayError, extra: Record<string, string> = {}): void {
    const status = httpStatus(err.code);
    if (status >= 500) this.log.warn({ code: err.code, details: err.details }, err.message);
    else this.log.debug({ code: err.code }, err.message);
    this.send(res, head, status, 'application/json', JSON.stringify({ error: err.toJSON(), ...(this.proxyId === undefined ? {} : { proxy: this.proxyId }) }), extra);
  }
}

const VALID_PATHS = `${VERSION_SERVER_PREFIX}<channel>/version and ${VERSION_SERVER_PREFIX}<channel>/critical`;

function badPath(message: string): GatewayError {
  return new GatewayError('GW_ERR_VERSION_BAD_PATH', `${message}; valid paths are ${VALID_PATHS}`);
}

/** The channel name and request type of a path under the prefix (query string already removed). */
export function parsePath(rawPath: string): { channel: string; what: VersionRequest } {
  const rest = rawPath.startsWith(VERSION_SERVER_PREFIX) ? rawPath.slice(VERSION_SERVER_PREFIX.length) : '';
  let decoded: string;
  try {
    decoded = decodeURIComponent(rest);
  } catch {
    throw badPath('the path has a bad percent-encoding');
  }
  if (decoded === '') throw badPath('the path names no channel');
  const parts = decoded.split('/');
  if (parts.some((p) => p === '')) throw badPath('the path has an empty segment');
  if (parts.some((p) => p === '.' || p === '..')) throw badPath('the path has a "." or ".." segment');
  const what = parts.pop()!;
  if (what !== 'version' && what !== 'critical') throw badPath(`the path ends with ${quote(what)}, not "version" or "critical"`);
  if (parts.length === 0) throw badPath('the path names no channel');
  return { channel: parts.join('/'), what };
}
