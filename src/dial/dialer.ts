/**
 * The one Dialer every outbound connection of the gateway uses (agents' tunnel and trust connection, gwsh, the
 * proxy's upstream calls). It reads the proxy environment on every dial (select.ts), then connects directly or
 * through an HTTP CONNECT proxy: an http:// proxy over TCP, an https:// proxy over verified TLS; or asks the
 * PAC file the environment names and tries its answer's entries in order (pac.ts).
 *
 * The returned socket is the tunnel: bytes the proxy sent after its 200 answer are pushed back into it, Nagle
 * is off, TCP keep-alive is on, and half-close passes through (allowHalfOpen) for direct and http:// proxies.
 */
import dns from 'node:dns';
import net from 'node:net';
import tls from 'node:tls';
import { formatHostPort, type HostPort } from '../addr.js';
import { GatewayError, type ErrorCode } from '../errors.js';
import { logger } from '../log.js';
import { buildConnectRequest, headerValue, parseConnectResponse, type ConnectResponse } from './connect.js';
import { dialPacSteps, PAC_FETCH_TIMEOUT_MS, PacCache, resolvePac, type PacResolution } from './pac.js';
import { PAC_TIME_MS } from './pacscript.js';
import type { PacSpec } from './pacspec.js';
import { parseTarget, selectProxy, type DialAlias, type DialTarget, type ProxyDecision, type ProxySpec } from './select.js';

export interface DialerOptions {
  /** Environment to read proxy variables from on each dial; process.env by default. */
  env?: Record<string, string | undefined>;
  /** TCP connect (plus TLS handshake for an https:// proxy) deadline. */
  connectTimeoutMs?: number;
  /** How long the proxy may take to answer CONNECT. */
  proxyAnswerTimeoutMs?: number;
  /** Extra CA certificates (PEM) trusted for https:// proxies, besides the system's. */
  proxyCa?: string | Buffer | Array<string | Buffer>;
  /** Idle time before the first TCP keep-alive probe. */
  keepAliveInitialDelayMs?: number;
  userAgent?: string;
  /** Name resolution for direct dials and for reaching the proxy (node's dns.lookup by default). */
  lookup?: net.LookupFunction;
  /** Where PAC files are cached (pac.ts); one cache for the whole process by default. */
  pacCache?: PacCache;
}

export interface DialOptions {
  signal?: AbortSignal;
  /**
   * Another name of the destination that NO_PROXY may list instead of its address (select.ts, rule 5): the
   * Kubernetes Service dials an API server with kubeApiAlias(cluster_name), kube.<cluster_name>.local:443.
   */
  alias?: DialAlias;
}

/** The proxy schemes dial() connects through; a PAC entry of another scheme is skipped with a reason. */
export const DIALABLE_PROXIES: ReadonlySet<string> = new Set(['http', 'https']);

let sharedPacCache: PacCache | undefined;
/** Past the PAC's own bounds (the fetch's deadline and the script's), a last bound on asking it. */
const PAC_ASK_BOUND_MS = PAC_FETCH_TIMEOUT_MS + PAC_TIME_MS + 5_000;

export const DIALER_DEFAULTS = Object.freeze({
  connectTimeoutMs: 15_000,
  proxyAnswerTimeoutMs: 15_000,
  keepAliveInitialDelayMs: 30_000,
  userAgent: 'gateway/17.0.0-dev',
});

type Target = string | DialTarget | HostPort;

function toTarget(target: Target): DialTarget {
  if (typeof target === 'string') return parseTarget(target);
  if ('kind' in target) return target;
  return { kind: 'gateway', host: target.host, port: target.port, text: formatHostPort(target.host, target.port) };
}

/** Runs fn with a deadline and an abort signal; on either, destroys the sockets and rejects with the given error. */
function withDeadline<T>(
  ms: number,
  signal: AbortSignal | undefined,
  onTimeout: () => GatewayError,
  run: (settle: { resolve: (v: T) => void; reject: (e: unknown) => void }) => () => void,
  describe: string,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let done = false;
    let cleanup: () => void = () => undefined;
    const finish = (fn: () => void) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      fn();
    };
    const onAbort = () =>
      finish(() => {
        cleanup();
        reject(new GatewayError('GW_ERR_DIAL_ABORTED', `dial ${describe} was cancelled`));
      });
    const timer = setTimeout(
      () =>
        finish(() => {
          cleanup();
          reject(onTimeout());
        }),
      ms,
    );
    if (signal?.aborted) {
      onAbort();
      return;
    }
    signal?.addEventListener('abort', onAbort, { once: true });
    cleanup = run({
      resolve: (v) => finish(() => resolve(v)),
      reject: (e) =>
        finish(() => {
          cleanup();
          reject(e);
        }),
    });
  });
}

export class Dialer {
  private readonly options: Required<Omit<DialerOptions, 'env' | 'proxyCa' | 'lookup' | 'pacCache'>> & Pick<DialerOptions, 'env' | 'proxyCa' | 'lookup'>;
  private readonly pacCache: PacCache;
  private readonly log = logger('dial');
  private readonly warned = new Set<string>();

  constructor(options: DialerOptions = {}) {
    const { pacCache, ...rest } = options;
    this.options = { ...DIALER_DEFAULTS, ...rest };
    this.pacCache = pacCache ?? (sharedPacCache ??= new PacCache());
  }

  /** The decision for target, without dialing (what `gateway dial-plan` prints). */
  plan(target: Target, alias?: DialAlias): ProxyDecision {
    const decision = selectProxy(toTarget(target), this.options.env ?? process.env, alias);
    for (const warning of decision.warnings) {
      if (this.warned.has(warning)) continue;
      this.warned.add(warning);
      this.log.warn(warning);
    }
    return decision;
  }

  /** Opens a connection to target, through the proxy the environment selects. */
  async dial(target: Target, options: DialOptions = {}): Promise<net.Socket> {
    const real = toTarget(target);
    const decision = this.plan(real, options.alias);
    const t = decision.target;
    if (decision.pac) return this.dialPac(decision.pac, t, options.signal);
    if (!decision.proxy) {
      this.log.debug({ target: formatHostPort(t.host, t.port), reason: decision.reason }, 'dialing directly');
      return this.direct(t, options.signal);
    }
    return this.through(t, decision.proxy, options.signal);
  }

  /** What the PAC answers for target and what each entry becomes (what `gateway dial-plan` prints); no dial. */
  async askPac(pac: PacSpec, target: DialTarget): Promise<PacResolution> {
    return resolvePac(pac, target, this.pacCache, this.pacLookup, DIALABLE_PROXIES);
  }

  /** A PAC decides: its answer's entries are tried in order (pac.ts); an answer that all fails sends the PAC to be fetched again. */
  private async dialPac(pac: PacSpec, t: DialTarget, signal: AbortSignal | undefined): Promise<net.Socket> {
    const where = formatHostPort(t.host, t.port);
    // Fetching and asking the PAC are bounded (pac.ts, pacscript.ts); a cancelled dial does not wait for them.
    const res = await withDeadline<PacResolution>(
      PAC_ASK_BOUND_MS,
      signal,
      () => new GatewayError('GW_ERR_DIAL_PAC_TIMEOUT', `asking the PAC ${pac.display} about ${where} took longer than ${PAC_ASK_BOUND_MS} ms`),
      ({ resolve, reject }) => {
        this.askPac(pac, t).then(resolve, reject);
        return () => undefined;
      },
      where,
    );
    try {
      return await dialPacSteps(res, t, (proxy) => (proxy ? this.through(t, proxy, signal) : this.direct(t, signal)), this.pacCache.bad, signal);
    } catch (err) {
      if (err instanceof GatewayError && err.code === 'GW_ERR_DIAL_PAC_EXHAUSTED') this.pacCache.invalidate(pac);
      throw err;
    }
  }

  private direct(t: DialTarget, signal: AbortSignal | undefined): Promise<net.Socket> {
    const where = formatHostPort(t.host, t.port);
    return this.connectTcp(t, signal, (code, why) =>
      new GatewayError(code === 'GW_ERR_DIAL_CONNECT_TIMEOUT' ? code : 'GW_ERR_DIAL_UNREACHABLE', `cannot connect to ${where}: ${why}`, {
        details: { target: where },
      }),
    );
  }

  private async through(t: DialTarget, proxy: ProxySpec, signal: AbortSignal | undefined): Promise<net.Socket> {
    const where = formatHostPort(t.host, t.port);
    this.log.debug({ target: where, proxy: proxy.display, source: proxy.source }, 'dialing through proxy');
    const context = `proxy ${proxy.display} (from ${proxy.source})`;
    const details = { target: where, proxy: proxy.display, variable: proxy.source };
    const raw = await this.connectTcp(proxy, signal, (code, why) =>
      new GatewayError(code === 'GW_ERR_DIAL_CONNECT_TIMEOUT' ? code : 'GW_ERR_DIAL_PROXY_UNREACHABLE', `cannot reach ${context} to dial ${where}: ${why}`, {
        details,
      }),
    );
    let socket: net.Socket = raw;
    try {
      if (proxy.protocol === 'https') socket = await this.startTls(raw, proxy, context, details, signal);
      await this.sendConnect(socket, t, proxy, context, details, signal);
    } catch (err) {
      socket.destroy();
      raw.destroy();
      throw err;
    }
    return socket;
  }

  /** The PAC helpers' name resolution: the Dialer's lookup, IPv4 (as every PAC helper expects). */
  private readonly pacLookup = (host: string): Promise<string | null> =>
    new Promise((resolve) => {
      const lookup = this.options.lookup ?? (dns.lookup as unknown as net.LookupFunction);
      lookup(host, { family: 4 }, (err, address) => resolve(err || typeof address !== 'string' ? null : address));
    });

  private connectTcp(
    to: HostPort,
    signal: AbortSignal | undefined,
    fail: (code: ErrorCode, why: string) => GatewayError,
  ): Promise<net.Socket> {
    const where = formatHostPort(to.host, to.port);
    return withDeadline<net.Socket>(
      this.options.connectTimeoutMs,
      signal,
      () => fail('GW_ERR_DIAL_CONNECT_TIMEOUT', `no TCP connection within ${this.options.connectTimeoutMs} ms`),
      ({ resolve, reject }) => {
        const socket = net.connect({
          host: to.host,
          port: to.port,
          allowHalfOpen: true,
          noDelay: true,
          keepAlive: true,
          keepAliveInitialDelay: this.options.keepAliveInitialDelayMs,
          ...(this.options.lookup ? { lookup: this.options.lookup } : {}),
        });
        const onError = (err: NodeJS.ErrnoException) => reject(fail('GW_ERR_DIAL_UNREACHABLE', err.message));
        socket.once('error', onError);
        socket.once('connect', () => {
          socket.off('error', onError);
          resolve(socket);
        });
        return () => socket.destroy();
      },
      where,
    );
  }

  private startTls(
    raw: net.Socket,
    proxy: ProxySpec,
    context: string,
    details: Record<string, unknown>,
    signal: AbortSignal | undefined,
  ): Promise<tls.TLSSocket> {
    const extra = this.options.proxyCa === undefined ? [] : ([] as Array<string | Buffer>).concat(this.options.proxyCa);
    return withDeadline<tls.TLSSocket>(
      this.options.connectTimeoutMs,
      signal,
      () =>
        new GatewayError('GW_ERR_DIAL_CONNECT_TIMEOUT', `no TLS handshake with ${context} within ${this.options.connectTimeoutMs} ms`, {
          details,
        }),
      ({ resolve, reject }) => {
        const socket = tls.connect({
          socket: raw,
          host: proxy.host,
          ...(net.isIP(proxy.host) ? {} : { servername: proxy.host }),
          ...(extra.length > 0 ? { ca: [...tls.rootCertificates, ...extra] } : {}),
        });
        const onError = (err: Error) =>
          reject(new GatewayError('GW_ERR_DIAL_PROXY_TLS', `TLS with ${context} failed: ${err.message}`, { details, cause: err }));
        socket.once('error', onError);
        socket.once('secureConnect', () => {
          socket.off('error', onError);
          resolve(socket);
        });
        return () => socket.destroy();
      },
      proxy.display,
    );
  }

  /** Sends CONNECT and reads the answer head; on success the tunnel's first bytes are pushed back unread. */
  private sendConnect(
    socket: net.Socket,
    target: DialTarget,
    proxy: ProxySpec,
    context: string,
    details: Record<string, unknown>,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const where = formatHostPort(target.host, target.port);
    const credentials = proxy.username === undefined ? undefined : { username: proxy.username, password: proxy.password ?? '' };
    return withDeadline<void>(
      this.options.proxyAnswerTimeoutMs,
      signal,
      () =>
        new GatewayError('GW_ERR_DIAL_PROXY_NO_ANSWER', `${context} did not answer CONNECT ${where} within ${this.options.proxyAnswerTimeoutMs} ms`, {
          details,
        }),
      ({ resolve, reject }) => {
        let buffered: Buffer = Buffer.alloc(0);
        const detach = () => {
          socket.off('readable', onReadable);
          socket.off('end', onEnd);
          socket.off('error', onError);
        };
        const fail = (err: GatewayError) => {
          detach();
          reject(err);
        };
        const onEnd = () =>
          fail(
            new GatewayError('GW_ERR_DIAL_PROXY_CLOSED', `${context} closed the connection before answering CONNECT ${where}`, {
              details,
            }),
          );
        const onError = (err: Error) =>
          fail(
            new GatewayError('GW_ERR_DIAL_PROXY_CLOSED', `${context} broke the connection during CONNECT ${where}: ${err.message}`, {
              details,
              cause: err,
            }),
          );
        const onReadable = () => {
          let chunk: Buffer | null;
          while ((chunk = socket.read() as Buffer | null) !== null) {
            buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
            let parsed;
            try {
              parsed = parseConnectResponse(buffered);
            } catch (err) {
              const e = err as GatewayError;
              fail(new GatewayError('GW_ERR_DIAL_PROXY_MALFORMED', `${context} gave a malformed answer to CONNECT ${where}: ${e.message}`, { details }));
              return;
            }
            if (!parsed.complete) continue;
            detach();
            const rest = buffered.subarray(parsed.headLength);
            if (parsed.statusCode >= 200 && parsed.statusCode < 300) {
              if (rest.length > 0) socket.unshift(rest);
              resolve();
            } else {
              reject(this.refusal(parsed, target, proxy, context, details));
            }
            return;
          }
        };
        socket.on('readable', onReadable);
        socket.once('end', onEnd);
        socket.once('error', onError);
        socket.write(buildConnectRequest(target, credentials, this.options.userAgent));
        return () => {
          detach();
          socket.destroy();
        };
      },
      where,
    );
  }

  private refusal(
    res: ConnectResponse,
    target: DialTarget,
    proxy: ProxySpec,
    context: string,
    details: Record<string, unknown>,
  ): GatewayError {
    const where = formatHostPort(target.host, target.port);
    const status = `${res.statusCode}${res.reason ? ` ${res.reason}` : ''}`;
    const d = { ...details, status: res.statusCode };
    if (res.statusCode === 407) {
      const scheme = headerValue(res, 'proxy-authenticate')?.split(/\s/)[0];
      const wants = scheme ? ` (it asks for ${scheme} authentication)` : '';
      return proxy.username === undefined
        ? new GatewayError('GW_ERR_DIAL_PROXY_AUTH_REQUIRED', `${context} requires authentication for CONNECT ${where}: ${status}${wants}`, { details: d })
        : new GatewayError('GW_ERR_DIAL_PROXY_AUTH_REFUSED', `${context} refused the credentials of user "${proxy.username}" for CONNECT ${where}: ${status}${wants}`, {
            details: d,
          });
    }
    const hint =
      res.statusCode === 403 && target.port !== 443
        ? `The proxy's policy may allow CONNECT only to port 443 (squid's default "http_access deny CONNECT !SSL_ports"). ` +
          `Use TLS routing (auth_service.proxy_listener_mode: multiplex), which carries every connection on 443, or ask for port ${target.port} to be allowed.`
        : undefined;
    return new GatewayError('GW_ERR_DIAL_PROXY_REFUSED', `${context} refused CONNECT ${where}: ${status}`, {
      details: d,
      ...(hint === undefined ? {} : { hint }),
    });
  }
}
