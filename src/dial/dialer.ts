/**
 * The one Dialer every outbound connection of the gateway uses (agents' tunnel and trust connection, gwsh, the
 * proxy's upstream calls). It reads the proxy environment on every dial (select.ts), then connects directly or
 * through an HTTP CONNECT proxy (an http:// proxy over TCP, an https:// proxy over verified TLS), or through a
 * SOCKS5 proxy (socks.ts: socks5:// with target names resolved here, socks5h:// by the proxy); or asks the PAC file the environment names and tries its answer's entries in order
 * (pac.ts). An HTTP proxy that
 * answers 407 is answered with the strongest scheme it offers that this client can do (auth/handshake.ts).
 *
 * The returned socket is the tunnel: bytes the proxy sent after its 200 answer are pushed back into it, Nagle
 * is off, TCP keep-alive is on, and half-close passes through (allowHalfOpen) for direct and http:// proxies.
 * Names are resolved at every dial (no address is kept), and a name with IPv6 and IPv4 addresses gets both
 * raced (family.ts), whatever the process's default (node --no-network-family-autoselection).
 * Each socket it returns remembers how it was dialled (dialRoute), so that a certificate refused on it later can
 * say whether a proxy was in the path (src/dial/tlsverify.ts).
 */
import dns from 'node:dns';
import net from 'node:net';
import tls from 'node:tls';
import { formatHostPort, type HostPort } from '../addr.js';
import { GatewayError, toGatewayError, type ErrorCode } from '../errors.js';
import { startDial } from '../metrics/dials.js';
import { logger } from '../log.js';
import { HAPPY_EYEBALLS_ATTEMPT_MS } from './family.js';
import { connectThroughProxy, type ProxyAnswer } from './auth/handshake.js';
import { PROXY_AUTH_SCHEMES, type ProxyAuthScheme } from './auth/scheme.js';
import { buildConnectRequest, parseConnectResponse, refusalFraming, type ConnectResponse } from './connect.js';
import { buildGreeting, buildSocksConnect, buildUserPass, parseAuthReply, parseConnectReply, parseMethodChoice, type SocksCredentials } from './socks.js';
import { dialPacSteps, PAC_FETCH_TIMEOUT_MS, PacCache, resolvePac, type PacResolution } from './pac.js';
import { PAC_TIME_MS } from './pacscript.js';
import type { PacSpec } from './pacspec.js';
import { parseTarget, selectProxy, type DialAlias, type DialTarget, type ProxyDecision, type ProxySpec } from './select.js';

export interface DialerOptions {
  /** Environment to read proxy variables from on each dial; process.env by default. */
  env?: Record<string, string | undefined>;
  /** TCP connect (plus TLS handshake for an https:// proxy) deadline. */
  connectTimeoutMs?: number;
  /** How long the proxy may take to answer CONNECT (for a SOCKS5 proxy: its whole handshake). */
  proxyAnswerTimeoutMs?: number;
  /** Extra CA certificates (PEM) trusted for https:// proxies, besides the system's. */
  proxyCa?: string | Buffer | Array<string | Buffer>;
  /** Idle time before the first TCP keep-alive probe. */
  keepAliveInitialDelayMs?: number;
  userAgent?: string;
  /**
   * Name resolution for direct dials and for reaching the proxy (node's dns.lookup by default). It is called with
   * { all: true } (Happy Eyeballs wants every address) and must answer with the list then.
   */
  lookup?: net.LookupFunction;
  /** The proxy authentication schemes this Dialer may answer with (src/dial/auth/scheme.ts's list by default). */
  authSchemes?: readonly ProxyAuthScheme[];
  /** Where PAC files are cached (pac.ts); one cache for the whole process by default. */
  pacCache?: PacCache;
  /**
   * Root CA files for TLS-inspecting proxies besides the environment's GATEWAY_PROXY_CA_FILE and
   * NODE_EXTRA_CA_CERTS (an agent's gateway.proxy_ca_file), with where each was named: src/dial/upgrade.ts.
   */
  inspectionRoots?: ReadonlyArray<{ path: string; from: string }>;
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
export const DIALABLE_PROXIES: ReadonlySet<string> = new Set(['http', 'https', 'socks5', 'socks5h']);

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

/** How a socket the Dialer returned was dialled: through which proxy (display form, password hidden), or directly. */
export interface DialRoute {
  /** auth: the scheme the proxy's 407 was answered with on this dial or an earlier one (dial-plan --probe prints it). */
  proxy: { display: string; source: string; auth?: string } | null;
}

const routes = new WeakMap<object, DialRoute>();

/** The route of a socket Dialer.dial returned; undefined for a stream the Dialer did not make. */
export function dialRoute(stream: object): DialRoute | undefined {
  return routes.get(stream);
}

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
  private readonly options: Required<Omit<DialerOptions, 'env' | 'proxyCa' | 'lookup' | 'authSchemes' | 'pacCache' | 'inspectionRoots'>> &
    Pick<DialerOptions, 'env' | 'proxyCa' | 'lookup' | 'inspectionRoots'>;
  private readonly pacCache: PacCache;
  private readonly log = logger('dial');
  private readonly warned = new Set<string>();
  private readonly authSchemes: readonly ProxyAuthScheme[];
  /**
   * Per proxy URL (as displayed, with its user), the scheme that last opened a tunnel: a pre-emptive one (Basic)
   * is then sent with the first CONNECT of the next dial, saving the round trip of the 407. Forgotten on a 407.
   */
  private readonly answered = new Map<string, ProxyAuthScheme>();

  constructor(options: DialerOptions = {}) {
    const { authSchemes, pacCache, ...rest } = options;
    this.options = { ...DIALER_DEFAULTS, ...rest };
    this.authSchemes = authSchemes ?? PROXY_AUTH_SCHEMES;
    this.pacCache = pacCache ?? (sharedPacCache ??= new PacCache());
  }

  /** The environment the proxy variables are read from (also the operator's roots for inspecting proxies: upgrade.ts). */
  get environment(): Record<string, string | undefined> {
    return this.options.env ?? process.env;
  }

  /** The root CA files given to this Dialer for TLS-inspecting proxies (besides the environment's). */
  get inspectionRootFiles(): ReadonlyArray<{ path: string; from: string }> {
    return this.options.inspectionRoots ?? [];
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
    const decision = this.plan(toTarget(target), options.alias);
    const done = startDial(decision.pac ? 'pac' : (decision.proxy?.protocol ?? 'direct'));
    try {
      const socket = await this.dialDecided(decision, options.signal);
      done({ ok: true, auth: routes.get(socket)?.proxy?.auth });
      return socket;
    } catch (err) {
      done({ ok: false, code: toGatewayError(err).code });
      throw err;
    }
  }

  private dialDecided(decision: ProxyDecision, signal: AbortSignal | undefined): Promise<net.Socket> {
    const t = decision.target;
    if (decision.pac) return this.dialPac(decision.pac, t, signal);
    if (!decision.proxy) {
      this.log.debug({ target: formatHostPort(t.host, t.port), reason: decision.reason }, 'dialing directly');
      return this.direct(t, signal);
    }
    return this.through(t, decision.proxy, signal);
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

  private async direct(t: DialTarget, signal: AbortSignal | undefined): Promise<net.Socket> {
    const where = formatHostPort(t.host, t.port);
    const direct = await this.connectTcp(t, signal, (code, why) =>
      new GatewayError(code === 'GW_ERR_DIAL_CONNECT_TIMEOUT' ? code : 'GW_ERR_DIAL_UNREACHABLE', `cannot connect to ${where}: ${why}`, {
        details: { target: where },
      }),
    );
    routes.set(direct, { proxy: null });
    return direct;
  }

  /** Through one proxy: SOCKS5 (socks.ts), or HTTP CONNECT answering a 407 with the strongest scheme offered (auth/). */
  private async through(t: DialTarget, proxy: ProxySpec, signal: AbortSignal | undefined): Promise<net.Socket> {
    const where = formatHostPort(t.host, t.port);
    const socksHost = proxy.protocol === 'socks5' ? await this.resolveHere(t, signal) : t.host;
    this.log.debug({ target: where, proxy: proxy.display, source: proxy.source }, 'dialing through proxy');
    const context = `proxy ${proxy.display} (from ${proxy.source})`;
    const details = { target: where, proxy: proxy.display, variable: proxy.source };
    const open = async (): Promise<net.Socket> => {
      const raw = await this.connectTcp(proxy, signal, (code, why) =>
        new GatewayError(code === 'GW_ERR_DIAL_CONNECT_TIMEOUT' ? code : 'GW_ERR_DIAL_PROXY_UNREACHABLE', `cannot reach ${context} to dial ${where}: ${why}`, {
          details,
        }),
      );
      if (proxy.protocol !== 'https') return raw;
      try {
        return await this.startTls(raw, proxy, context, details, signal);
      } catch (err) {
        raw.destroy();
        throw err;
      }
    };
    const remembered = this.answered.get(proxy.display);
    try {
      if (proxy.protocol === 'socks5' || proxy.protocol === 'socks5h') {
        const socket = await open();
        try {
          await this.socksConnect(socket, { ...t, host: socksHost }, proxy, context, details, signal);
        } catch (err) {
          socket.destroy();
          throw err;
        }
        routes.set(socket, { proxy: { display: proxy.display, source: proxy.source } });
        return socket;
      }
      const { socket, scheme } = await connectThroughProxy(
        {
          open,
          exchange: (socket, authorization) => this.sendConnect(socket, t, authorization, context, details, signal),
          refusal: (res) => this.refusal(res, t, context, details),
        },
        { proxy, request: { method: 'CONNECT', uri: where }, context, details, log: this.log, schemes: this.authSchemes, ...(remembered ? { remembered } : {}) },
      );
      if (scheme) this.answered.set(proxy.display, scheme);
      routes.set(socket, { proxy: { display: proxy.display, source: proxy.source, ...(scheme ? { auth: scheme.name } : {}) } });
      return socket;
    } catch (err) {
      this.answered.delete(proxy.display);
      throw err;
    }
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
          autoSelectFamily: true,
          autoSelectFamilyAttemptTimeout: HAPPY_EYEBALLS_ATTEMPT_MS,
          ...(this.options.lookup ? { lookup: this.options.lookup } : {}),
        });
        const onError = (err: NodeJS.ErrnoException) => reject(fail('GW_ERR_DIAL_UNREACHABLE', err.message));
        socket.once('error', onError);
        socket.once('connect', () => {
          socket.off('error', onError);
          this.log.debug({ to: where, address: socket.remoteAddress, family: socket.remoteFamily }, 'connected');
          resolve(socket);
        });
        return () => socket.destroy();
      },
      where,
    );
  }

  /** socks5:// resolves the target's name here (as curl does) and hands the SOCKS server an address. */
  private resolveHere(t: DialTarget, signal: AbortSignal | undefined): Promise<string> {
    if (net.isIP(t.host)) return Promise.resolve(t.host);
    const where = formatHostPort(t.host, t.port);
    const lookup = this.options.lookup ?? dns.lookup;
    const hint = 'socks5:// resolves target names on this host; use socks5h:// to have the SOCKS server resolve them.';
    return withDeadline<string>(
      this.options.connectTimeoutMs,
      signal,
      () => new GatewayError('GW_ERR_DIAL_CONNECT_TIMEOUT', `cannot resolve ${t.host} within ${this.options.connectTimeoutMs} ms to dial ${where}`, { details: { target: where }, hint }),
      ({ resolve, reject }) => {
        lookup(t.host, {}, (err, address) => {
          if (err || typeof address !== 'string') {
            reject(new GatewayError('GW_ERR_DIAL_UNREACHABLE', `cannot resolve ${t.host} on this host to dial ${where}: ${err?.message ?? 'no address'}`, { details: { target: where }, hint }));
          } else resolve(address);
        });
        return () => undefined;
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

  /**
   * Sends CONNECT and reads the answer head: on a 2xx the tunnel's first bytes are pushed back unread; on another
   * status the body is read and dropped when the connection can carry the next request (refusalFraming).
   */
  private sendConnect(
    socket: net.Socket,
    target: DialTarget,
    authorization: string | undefined,
    context: string,
    details: Record<string, unknown>,
    signal: AbortSignal | undefined,
  ): Promise<ProxyAnswer> {
    const where = formatHostPort(target.host, target.port);
    return withDeadline<ProxyAnswer>(
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
          answer
            ? settled({ ...answer, reusable: false }) // the refusal's body ended early: its head still counts
            : fail(
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
        let answer: ProxyAnswer | undefined;
        let bodyLeft = 0;
        const onReadable = () => {
          let chunk: Buffer | null;
          while ((chunk = socket.read() as Buffer | null) !== null) {
            if (answer) {
              bodyLeft -= chunk.length;
              if (bodyLeft <= 0) return settled(answer);
              continue;
            }
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
            const rest = buffered.subarray(parsed.headLength);
            if (parsed.statusCode >= 200 && parsed.statusCode < 300) {
              if (rest.length > 0) socket.unshift(rest);
              return settled({ response: parsed, reusable: false });
            }
            const framing = refusalFraming(parsed);
            answer = { response: parsed, reusable: framing.reusable };
            bodyLeft = framing.bodyLength - rest.length;
            if (!framing.reusable || bodyLeft <= 0) return settled(answer);
          }
        };
        const settled = (a: ProxyAnswer) => {
          detach();
          resolve(a);
        };
        socket.on('readable', onReadable);
        socket.once('end', onEnd);
        socket.once('error', onError);
        // A kept-alive connection the proxy already closed emits nothing more: say so now, not at the deadline.
        if (socket.destroyed || socket.readableEnded) onEnd();
        else socket.write(buildConnectRequest(target, authorization, this.options.userAgent));
        return () => {
          detach();
          socket.destroy();
        };
      },
      where,
    );
  }

  /**
   * The SOCKS5 handshake (socks.ts) under one deadline: method choice, RFC 1929 credentials when the server picks
   * them, CONNECT. Bytes after the reply belong to the tunnel and are pushed back unread.
   */
  private socksConnect(socket: net.Socket, target: DialTarget, proxy: ProxySpec, context: string, details: Record<string, unknown>, signal: AbortSignal | undefined): Promise<void> {
    const where = formatHostPort(target.host, target.port);
    const creds: SocksCredentials | undefined = proxy.username === undefined ? undefined : { username: proxy.username, password: proxy.password ?? '' };
    const wrap = (err: GatewayError) => new GatewayError(err.code, `${context}, dialing ${where}: ${err.message}`, { details: { ...details, ...err.details }, ...socksHint(err) });
    return withDeadline<void>(
      this.options.proxyAnswerTimeoutMs,
      signal,
      () => new GatewayError('GW_ERR_DIAL_SOCKS_NO_ANSWER', `${context} did not finish the SOCKS5 handshake for ${where} within ${this.options.proxyAnswerTimeoutMs} ms`, { details }),
      ({ resolve, reject }) => {
        let buffered: Buffer = Buffer.alloc(0);
        let phase: 'method' | 'auth' | 'reply' = 'method';
        const detach = () => {
          socket.off('readable', onReadable);
          socket.off('end', onEnd);
          socket.off('error', onError);
        };
        const fail = (err: GatewayError) => {
          detach();
          reject(err);
        };
        const onEnd = () => fail(wrap(new GatewayError('GW_ERR_DIAL_SOCKS_CLOSED', `the SOCKS server closed the connection while waiting for its ${phase === 'method' ? 'method choice' : phase === 'auth' ? 'answer to the credentials' : 'reply to CONNECT'}`)));
        const onError = (err: Error) => fail(wrap(new GatewayError('GW_ERR_DIAL_SOCKS_CLOSED', `the SOCKS connection broke: ${err.message}`, { cause: err })));
        /** Consumes what the answers so far allow; true once the tunnel is open. */
        const advance = (): boolean => {
          for (;;) {
            if (phase === 'reply') {
              const r = parseConnectReply(buffered);
              if (!r.complete) return false;
              const rest = buffered.subarray(r.length);
              if (rest.length > 0) socket.unshift(rest);
              return true;
            }
            const r = phase === 'method' ? parseMethodChoice(buffered, creds !== undefined) : parseAuthReply(buffered, creds?.username ?? '');
            if (!r.complete) return false;
            buffered = buffered.subarray(r.length);
            const next = 'method' in r && r.method === 'userpass' && creds ? 'auth' : 'reply';
            socket.write(next === 'auth' && creds ? buildUserPass(creds) : buildSocksConnect(target.host, target.port));
            phase = next;
          }
        };
        const onReadable = () => {
          let chunk: Buffer | null;
          while ((chunk = socket.read() as Buffer | null) !== null) {
            buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
            try {
              if (!advance()) continue;
            } catch (err) {
              fail(err instanceof GatewayError ? wrap(err) : wrap(new GatewayError('GW_ERR_DIAL_SOCKS_MALFORMED', String(err))));
              return;
            }
            detach();
            resolve();
            return;
          }
        };
        socket.on('readable', onReadable);
        socket.once('end', onEnd);
        socket.once('error', onError);
        socket.write(buildGreeting(creds !== undefined));
        return () => {
          detach();
          socket.destroy();
        };
      },
      where,
    );
  }

  /**
   * The error for an answer that is neither 2xx nor 407 (auth/handshake.ts answers a 407): a refusal by the proxy's
   * rules (403, ...: GW_ERR_DIAL_PROXY_REFUSED), or the proxy's own failure to reach the target (502, 503, 504:
   * GW_ERR_DIAL_PROXY_TARGET_UNREACHABLE), whose fix is at the target, not in the proxy's rules.
   */
  private refusal(res: ConnectResponse, target: DialTarget, context: string, details: Record<string, unknown>): GatewayError {
    const where = formatHostPort(target.host, target.port);
    const status = `${res.statusCode}${res.reason ? ` ${res.reason}` : ''}`;
    const d = { ...details, status: res.statusCode };
    // 502, 503, 504: the proxy's own dial failed (squid: ERR_CONNECT_FAIL, ERR_DNS_FAIL, timeouts); its rules allowed it.
    if (res.statusCode === 502 || res.statusCode === 503 || res.statusCode === 504) {
      return new GatewayError('GW_ERR_DIAL_PROXY_TARGET_UNREACHABLE', `${context} could not reach ${where} (it answered CONNECT with ${status})`, {
        details: d,
        hint: `The proxy is reachable, but ${where} is not from it: check that ${where} is up and listening, that the proxy can resolve ${target.host} (its DNS), and that the proxy's own outbound firewall lets it reach port ${target.port}.`,
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

/** A hint naming the likely fix for a SOCKS reply code, where the code's default hint is too general. */
function socksHint(err: GatewayError): { hint?: string } {
  const reply = err.details.reply;
  if (err.code !== 'GW_ERR_DIAL_SOCKS_REFUSED') return {};
  if (reply === 2) return { hint: "The SOCKS server's rules do not allow this client or this destination (dante: the client pass / socks pass rules in danted.conf)." };
  if (reply === 3 || reply === 4 || reply === 5) return { hint: 'The SOCKS server cannot reach the target: check the address and port, and that the SOCKS server can resolve the name (socks5h://) or reach the address (socks5://).' };
  return {};
}
