/**
 * PAC files for the Dialer: fetching them (with a deadline and a size cap, cached, fetched again on a schedule
 * and after failures, with the one Backoff), asking them about a target (pacscript.ts), and trying their answer's
 * entries in order with fail-over. The rules and figures are written out in docs/dialing.md, "PAC and WPAD".
 *
 * A PAC file is always fetched directly (TCP to the host of its URL, the system CAs and NODE_EXTRA_CA_CERTS for
 * https), never through a proxy: not through the proxies it names, and not through a proxy variable, which is
 * what names the PAC. Redirects are not followed.
 *
 * Fail-over: the next entry is tried only when this one could not be reached (refused, no route, no TCP within
 * the connect timeout, no answer to CONNECT in time). A proxy that answers (403, 407, a TLS failure) decides:
 * its error is the dial's, and no later entry (DIRECT above all) is tried behind its back.
 */
import { readFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { formatHostPort } from '../addr.js';
import { Backoff } from '../backoff.js';
import { GatewayError, type ErrorCode } from '../errors.js';
import { logger } from '../log.js';
import { redactUrl } from '../redact.js';
import { parsePacAnswer, type PacEntry } from './pacanswer.js';
import { runPac, type PacLookup } from './pacscript.js';
import { wpadCandidates, type PacSpec } from './pacspec.js';
import type { DialTarget, ProxySpec } from './select.js';

export const PAC_FETCH_TIMEOUT_MS = 10_000;
export const PAC_MAX_BYTES = 1024 * 1024;
/** A PAC older than this is fetched again by the next dial that needs it. */
export const PAC_REFRESH_MS = 30 * 60_000;
/** After a failed fetch (or a PAC whose answer all failed) the next fetch waits this Backoff's delay. */
export const PAC_RETRY = { firstMs: 1_000, maxMs: 5 * 60_000, jitter: 'equal' } as const;

export interface PacFetchOptions {
  timeoutMs?: number;
  maxBytes?: number;
  lookup?: net.LookupFunction;
}

function fetchError(url: string, why: string, cause?: unknown): GatewayError {
  const shown = redactUrl(url);
  return new GatewayError('GW_ERR_DIAL_PAC_FETCH', `cannot fetch the PAC file ${shown}: ${why}`, {
    details: { pac: shown },
    ...(cause === undefined ? {} : { cause }),
  });
}

/** Fetches one PAC URL (http:, https: or file:) with a deadline for the whole body and a size cap. */
export async function fetchPacFile(url: string, options: PacFetchOptions = {}): Promise<string> {
  const maxBytes = options.maxBytes ?? PAC_MAX_BYTES;
  const timeoutMs = options.timeoutMs ?? PAC_FETCH_TIMEOUT_MS;
  const u = new URL(url);
  if (u.protocol === 'file:') {
    let body: Buffer;
    try {
      body = await readFile(u);
    } catch (err) {
      throw fetchError(url, (err as Error).message, err);
    }
    if (body.length > maxBytes) throw fetchError(url, `it is larger than ${maxBytes} bytes`);
    return body.toString('utf8');
  }
  const get = u.protocol === 'https:' ? https.get : http.get;
  return new Promise<string>((resolve, reject) => {
    const req = get(u, { agent: false, signal: AbortSignal.timeout(timeoutMs), ...(options.lookup ? { lookup: options.lookup } : {}) }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(fetchError(url, `the server answered ${res.statusCode}${res.statusMessage ? ` ${res.statusMessage}` : ''}, not 200`));
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        if (size > maxBytes) req.destroy(fetchError(url, `it is larger than ${maxBytes} bytes`));
        else chunks.push(c);
      });
      res.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
      res.on('error', (err) => reject(err instanceof GatewayError ? err : fetchError(url, err.message, err)));
    });
    req.on('error', (err) => {
      if (err instanceof GatewayError) reject(err);
      else if (err.name === 'AbortError' || err.name === 'TimeoutError') reject(fetchError(url, `no complete answer within ${timeoutMs} ms`));
      else reject(fetchError(url, err.message, err));
    });
  });
}

interface Cached {
  script?: { text: string; url: string; fetchedAt: number };
  retryAt: number;
  lastError?: GatewayError;
  inflight?: Promise<void>;
  backoff: Backoff;
}

export interface PacScript {
  text: string;
  /** The URL it came from, any password as "***" (for WPAD, the candidate that answered). */
  url: string;
}

export interface PacCacheOptions extends PacFetchOptions {
  now?: () => number;
  /** The resolv.conf read for WPAD; /etc/resolv.conf by default. */
  resolvConf?: () => Promise<string>;
  refreshMs?: number;
}

/**
 * The fetched PAC files, by what named them. get() answers the cached script while it is younger than
 * refreshMs; an older one is fetched again. A failed fetch keeps the last good script (logged) and waits a
 * Backoff delay before the next try; with no good script the dial fails at once with the last fetch error.
 */
export class PacCache {
  private readonly entries = new Map<string, Cached>();
  private readonly log = logger('dial');
  private readonly now: () => number;
  /** Entries that could not be reached lately, shared by every PAC this cache holds. */
  readonly bad: BadEntries;

  constructor(private readonly options: PacCacheOptions = {}) {
    this.now = options.now ?? Date.now;
    this.bad = new BadEntries(this.now);
  }

  async get(spec: PacSpec): Promise<PacScript> {
    const key = `${spec.kind} ${spec.url ?? ''}`;
    let c = this.entries.get(key);
    if (!c) {
      c = { retryAt: 0, backoff: new Backoff(PAC_RETRY) };
      this.entries.set(key, c);
    }
    const now = this.now();
    const fresh = c.script && now - c.script.fetchedAt < (this.options.refreshMs ?? PAC_REFRESH_MS);
    if (!fresh && now >= c.retryAt) {
      c.inflight ??= this.refetch(spec, c).finally(() => {
        c.inflight = undefined;
      });
      await c.inflight;
    }
    if (c.script) return { text: c.script.text, url: c.script.url };
    throw c.lastError ?? fetchError(spec.display, 'not fetched yet');
  }

  /** The PAC's answer failed as a whole (or its script failed): fetch it again, after the Backoff's delay. */
  invalidate(spec: PacSpec): void {
    const c = this.entries.get(`${spec.kind} ${spec.url ?? ''}`);
    if (!c) return;
    if (c.script) c.script.fetchedAt = -Infinity;
    c.retryAt = this.now() + c.backoff.next();
  }

  private async refetch(spec: PacSpec, c: Cached): Promise<void> {
    try {
      // The URL kept (shown in every message and log line, and the script's file name) has no password.
      const got = spec.kind === 'wpad' ? await this.discover() : { url: redactUrl(spec.url!), text: await fetchPacFile(spec.url!, this.options) };
      c.script = { ...got, fetchedAt: this.now() };
      c.lastError = undefined;
      c.retryAt = 0;
      c.backoff.reset();
    } catch (err) {
      c.lastError = err instanceof GatewayError ? err : fetchError(spec.display, String(err));
      const delay = c.backoff.next();
      c.retryAt = this.now() + delay;
      if (c.script) this.log.warn({ pac: c.script.url, error: c.lastError.code, retryInMs: delay }, `${c.lastError.message}; using the copy fetched before`);
    }
  }

  /** WPAD: the first candidate URL that answers 200, most specific domain first. */
  private async discover(): Promise<{ url: string; text: string }> {
    const conf = await (this.options.resolvConf ?? (() => readFile('/etc/resolv.conf', 'utf8')))().catch(() => '');
    const candidates = wpadCandidates(conf);
    const tried: string[] = [];
    for (const url of candidates) {
      try {
        return { url, text: await fetchPacFile(url, this.options) };
      } catch (err) {
        tried.push(`${url}: ${(err as Error).message}`);
      }
    }
    throw new GatewayError(
      'GW_ERR_DIAL_WPAD_NOT_FOUND',
      candidates.length === 0
        ? 'WPAD (GATEWAY_WPAD) found no search domain in /etc/resolv.conf to look for wpad.<domain> in'
        : `WPAD (GATEWAY_WPAD) found no PAC file: ${tried.join('; ')}`,
      { details: { candidates } },
    );
  }
}

/** How long an entry that could not be reached is tried last (as browsers keep their "bad proxy" list). */
export const PAC_BAD_ENTRY_MS = 5 * 60_000;

/**
 * Entries that could not be reached lately, by their text ("PROXY a:3128"): for PAC_BAD_ENTRY_MS they are
 * tried after the others (still tried: the last resort), so that a proxy that is down behind a firewall that
 * drops packets does not cost every dial a connect timeout. A success clears the entry.
 */
export class BadEntries {
  private readonly until = new Map<string, number>();

  constructor(private readonly now: () => number = Date.now) {}

  failed(entry: string): void {
    this.until.set(entry, this.now() + PAC_BAD_ENTRY_MS);
  }

  worked(entry: string): void {
    this.until.delete(entry);
  }

  /** The time until which the entry is tried last, or undefined. */
  badUntil(entry: string): number | undefined {
    const t = this.until.get(entry);
    if (t !== undefined && t <= this.now()) this.until.delete(entry);
    return t !== undefined && t > this.now() ? t : undefined;
  }

  /** The steps in the order a dial tries them: those not recently failed first, each group in the PAC's order. */
  order<T extends { entry: PacEntry }>(steps: T[]): T[] {
    const bad = steps.filter((s) => this.badUntil(s.entry.text) !== undefined);
    return [...steps.filter((s) => !bad.includes(s)), ...bad];
  }
}

/** One entry of a PAC answer and what the Dialer makes of it. */
export interface PacStep {
  entry: PacEntry;
  /** null: a direct dial; undefined with skipped: an entry this Dialer cannot use. */
  proxy?: ProxySpec | null;
  skipped?: string;
}

export interface PacResolution {
  /** The PAC file's URL. */
  url: string;
  /** What FindProxyForURL returned. */
  answer: string;
  steps: PacStep[];
}

/** The URL FindProxyForURL is asked about: scheme, host and port only (no path reaches the PAC). */
export function pacQueryUrl(t: DialTarget): string {
  return `${t.kind === 'http' ? 'http' : 'https'}://${formatHostPort(t.host, t.port)}/`;
}

/** What each entry becomes in the Dialer's terms; protocols the Dialer cannot dial are skipped with a reason. */
export function pacSteps(entries: PacEntry[], pacUrl: string, dialable: ReadonlySet<string>): PacStep[] {
  return entries.map((entry): PacStep => {
    if (entry.kind === 'direct') return { entry, proxy: null };
    if (!dialable.has(entry.protocol)) return { entry, skipped: `this Dialer does not dial ${entry.protocol}:// proxies` };
    if (['localhost', '127.0.0.1', '::1'].includes(entry.host)) return { entry, skipped: 'a proxy on localhost / 127.0.0.1 is refused, as in HTTPS_PROXY' };
    const display = `${entry.protocol}://${formatHostPort(entry.host, entry.port)}`;
    const proxy = { protocol: entry.protocol as ProxySpec['protocol'], host: entry.host, port: entry.port, display, source: `PAC ${pacUrl}` };
    return { entry, proxy };
  });
}

/** Asks the PAC (through the cache) about target. Throws the GW_ERR_DIAL_PAC_* errors; invalidates the cache on a script error. */
export async function resolvePac(spec: PacSpec, target: DialTarget, cache: PacCache, lookup: PacLookup, dialable: ReadonlySet<string>): Promise<PacResolution> {
  const script = await cache.get(spec);
  let answer: unknown;
  try {
    answer = await runPac(script.text, pacQueryUrl(target), target.host, { url: script.url, lookup });
  } catch (err) {
    cache.invalidate(spec);
    throw err;
  }
  let entries: PacEntry[];
  try {
    entries = parsePacAnswer(answer);
  } catch (err) {
    const e = err as GatewayError;
    throw new GatewayError('GW_ERR_DIAL_PAC_ANSWER', `the PAC file ${script.url} answered for ${target.text}: ${e.message}`, { details: { pac: script.url } });
  }
  return { url: script.url, answer: typeof answer === 'string' ? answer : 'DIRECT', steps: pacSteps(entries, script.url, dialable) };
}

/** The failures after which the next entry is tried: the entry could not be reached. */
const FAIL_OVER = new Set<ErrorCode>(['GW_ERR_DIAL_UNREACHABLE', 'GW_ERR_DIAL_PROXY_UNREACHABLE', 'GW_ERR_DIAL_CONNECT_TIMEOUT', 'GW_ERR_DIAL_PROXY_NO_ANSWER']);

/**
 * Tries the steps in order, those that could not be reached lately last (BadEntries); throws
 * GW_ERR_DIAL_PAC_EXHAUSTED (each entry and why) when none could be reached.
 */
export async function dialPacSteps(
  res: PacResolution,
  target: DialTarget,
  open: (proxy: ProxySpec | null) => Promise<net.Socket>,
  bad: BadEntries,
  signal?: AbortSignal,
): Promise<net.Socket> {
  const log = logger('dial');
  const why: string[] = [];
  for (const step of bad.order(res.steps)) {
    if (step.skipped !== undefined || step.proxy === undefined) {
      why.push(`${step.entry.text}: skipped (${step.skipped})`);
      continue;
    }
    try {
      const socket = await open(step.proxy);
      bad.worked(step.entry.text);
      log.debug({ target: target.text, pac: res.url, entry: step.entry.text }, 'dialled through the PAC entry');
      return socket;
    } catch (err) {
      if (!(err instanceof GatewayError) || !FAIL_OVER.has(err.code) || signal?.aborted) throw err;
      why.push(`${step.entry.text}: ${err.code}`);
      bad.failed(step.entry.text);
      log.warn({ target: target.text, pac: res.url, entry: step.entry.text, error: err.code }, 'PAC entry cannot be reached; trying the next');
    }
  }
  throw new GatewayError('GW_ERR_DIAL_PAC_EXHAUSTED', `no entry of the PAC file ${res.url}'s answer "${res.answer}" for ${target.text} could be used: ${why.join('; ')}`, {
    details: { pac: res.url, target: target.text },
  });
}
