/**
 * Proxy selection from the environment: the one rule set every outbound connection of the gateway follows.
 * The rules are written out in docs/dialing.md; this file is their only implementation.
 *
 *  1. A target that is localhost or a loopback IP is always dialled directly.
 *  2. Which variable: an https:// URL uses HTTPS_PROXY, then https_proxy. A bare host:port (the gateway's own
 *     dials: TLS, SSH, HTTPS on 3080 / 443 / 3024) uses HTTPS_PROXY, https_proxy, then HTTP_PROXY, http_proxy.
 *     An http:// URL uses HTTP_PROXY, then http_proxy. Uppercase wins; an empty value counts as unset.
 *     Every kind then falls back to ALL_PROXY, then all_proxy (lowest precedence, as curl has it).
 *  3. The value must be scheme://[user[:password]@]host[:port] with scheme http, https, socks5 (names resolved
 *     here) or socks5h (names resolved by the SOCKS server), or a bare host[:port] (http:// is assumed); the port
 *     defaults to the scheme's (80 / 443 / 1080). Anything else is an error naming the variable, and so is a
 *     proxy host of localhost or 127.0.0.1 (or ::1): never a silent direct dial.
 *  4. NO_PROXY (uppercase wins over no_proxy; empty counts as unset) exempts matching targets (see noproxy.ts).
 *  5. A dial with an alias (the Kubernetes Service's dial of an API server, alias kube.<cluster_name>.local:443)
 *     is exempt when NO_PROXY exempts either the address dialled or the alias.
 *  6. A value pac+http(s)://... or pac+file://... names a PAC file, and GATEWAY_WPAD=1 with none of the
 *     variables set asks for WPAD (pacspec.ts): after rules 1 and 4, the decision carries the PAC, which the
 *     Dialer asks at dial time (pac.ts).
 */
import { isIP } from 'node:net';
import { AddrError, formatHostPort, isLoopbackHost, parseAddr, urlAuthority, type HostPort } from '../addr.js';
import { GatewayError } from '../errors.js';
import { REDACTED, redactUserinfo, splitUserinfo } from '../redact.js';
import { matchNoProxy, parseNoProxy } from './noproxy.js';
import { isPacValue, parsePacValue, wpadSpec, type PacSpec } from './pacspec.js';

export type TargetKind = 'gateway' | 'http' | 'https';

export interface DialTarget extends HostPort {
  /** 'gateway' for a bare host:port (the gateway's own TLS / SSH / HTTPS dials), else the URL's scheme. */
  kind: TargetKind;
  /** The target as the caller wrote it. */
  text: string;
}

export type ProxyProtocol = 'http' | 'https' | 'socks5' | 'socks5h';

export interface ProxySpec {
  /** socks5: target names are resolved here and sent as addresses; socks5h: sent as names, for the proxy to resolve. */
  protocol: ProxyProtocol;
  host: string;
  port: number;
  /** Percent-decoded credentials from the URL, or undefined. Never log these. */
  username?: string;
  password?: string;
  /** The proxy URL with the password replaced by "***": the only form that may be shown or logged. */
  display: string;
  /** The variable the value came from. */
  source: string;
}

export interface ProxyDecision {
  target: DialTarget;
  /** null: dial directly. */
  proxy: ProxySpec | null;
  /** The variable that decided (HTTPS_PROXY, ..., NO_PROXY, no_proxy), or null when no variable was involved. */
  source: string | null;
  /** One sentence naming the rule or the NO_PROXY entry that decided. */
  reason: string;
  /** NO_PROXY entries that were ignored, one sentence each. */
  warnings: string[];
  /** For a dial with an alias (a Kubernetes API server): the NO_PROXY check of its address and of the alias. */
  checks?: NoProxyCheck[];
  /** A PAC file decides (proxy is then null): a pac+ value, or WPAD (docs/dialing.md, "PAC and WPAD"). */
  pac?: PacSpec;
}

type Env = Record<string, string | undefined>;

/** The value of the first variable that is set and not blank. */
function firstSet(env: Env, names: readonly string[]): { name: string; value: string } | undefined {
  for (const name of names) {
    const value = env[name];
    if (value !== undefined && value.trim() !== '') return { name, value: value.trim() };
  }
  return undefined;
}

const PROXY_VARS: Record<TargetKind, readonly string[]> = {
  https: ['HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy'],
  gateway: ['HTTPS_PROXY', 'https_proxy', 'HTTP_PROXY', 'http_proxy', 'ALL_PROXY', 'all_proxy'],
  http: ['HTTP_PROXY', 'http_proxy', 'ALL_PROXY', 'all_proxy'],
};

const DEFAULT_PORTS: Record<ProxyProtocol, number> = { http: 80, https: 443, socks5: 1080, socks5h: 1080 };

function isProxyProtocol(p: string): p is ProxyProtocol {
  return Object.hasOwn(DEFAULT_PORTS, p);
}

/**
 * A decision as span attributes (src/trace.ts): how (direct, proxy, pac), through which proxy (its display form:
 * the password is "***"), and the reason `gateway dial-plan` prints. Never the proxy's credentials.
 */
export function decisionAttributes(decision: ProxyDecision): Record<string, string> {
  const via = decision.pac ? 'pac' : decision.proxy ? 'proxy' : 'direct';
  return {
    'gateway.dial.via': via,
    'gateway.dial.target': decision.target.text,
    ...(decision.proxy ? { 'gateway.dial.proxy': decision.proxy.display } : {}),
    ...(decision.source ? { 'gateway.dial.source': decision.source } : {}),
    'gateway.dial.reason': decision.reason,
  };
}

/** What a proxy is, for the reasons shown: "a SOCKS5 proxy (target names resolved by the proxy)". */
export function describeProxyKind(protocol: ProxyProtocol): string {
  if (protocol === 'socks5h') return 'a SOCKS5 proxy (target names resolved by the proxy)';
  if (protocol === 'socks5') return 'a SOCKS5 proxy (target names resolved on this host)';
  return `an ${protocol.toUpperCase()} proxy`;
}

/** Parses "host:port", "[v6]:port" or an http(s):// URL into a dial target. */
export function parseTarget(text: string): DialTarget {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(text);
  const bad = (why: string | AddrError) =>
    new GatewayError('GW_ERR_DIAL_BAD_TARGET', `bad dial target "${text}": ${typeof why === 'string' ? why : why.message}`, {
      details: { target: text },
      ...(typeof why !== 'string' && why.hint ? { hint: why.hint } : {}),
    });
  if (scheme) {
    const kind = scheme[1]!.toLowerCase();
    if (kind !== 'http' && kind !== 'https') throw bad(`scheme "${kind}" is not http or https`);
    // The host as written, checked first (URL() reads "1.2.3" as 1.2.0.3); non-ASCII names in punycode form.
    const authority = urlAuthority(text);
    const written = authority !== undefined && /^[\x21-\x7e]*$/.test(authority) ? authority : undefined;
    try {
      if (written !== undefined) parseAddr(written);
    } catch (err) {
      throw bad(err instanceof AddrError ? err : String(err));
    }
    let url: URL;
    try {
      url = new URL(text);
    } catch {
      throw bad('not a valid URL');
    }
    try {
      const { host } = parseAddr(written ?? url.host);
      const port = url.port === '' ? (kind === 'https' ? 443 : 80) : Number(url.port);
      return { kind, host, port, text };
    } catch (err) {
      throw bad(err instanceof AddrError ? err : String(err));
    }
  }
  try {
    const { host, port } = parseAddr(text);
    if (port === undefined) throw new AddrError('a port is required (host:port)');
    return { kind: 'gateway', host, port, text };
  } catch (err) {
    throw bad(err instanceof AddrError ? err : String(err));
  }
}

/** Parses one proxy variable's value. Throws GW_ERR_DIAL_PROXY_ENV / GW_ERR_DIAL_PROXY_LOOPBACK naming the variable. */
export function parseProxyValue(value: string, source: string): ProxySpec {
  const raw = value.trim();
  const envError = (why: string) =>
    new GatewayError('GW_ERR_DIAL_PROXY_ENV', `${source}="${redactUserinfo(raw)}" is not a usable proxy: ${why}`, {
      details: { variable: source },
    });
  const { scheme, userinfo, rest: afterUserinfo } = splitUserinfo(raw);
  const protocol = scheme?.toLowerCase() ?? 'http';
  if (/^socks4a?$|^socks$/.test(protocol)) {
    throw envError(`scheme "${protocol}" (SOCKS4) is not supported: it carries no password; use socks5:// or socks5h://`);
  }
  if (!isProxyProtocol(protocol)) {
    throw envError(`scheme "${protocol}" is not supported; use http://, https://, socks5:// or socks5h://`);
  }
  // host[:port] ends at the first "/", "?" or "#"; only an empty path or "/" may follow.
  const end = afterUserinfo.search(/[/?#]/);
  const hostport = end < 0 ? afterUserinfo : afterUserinfo.slice(0, end);
  const tail = end < 0 ? '' : afterUserinfo.slice(end);
  if (tail !== '' && tail !== '/') throw envError(`a proxy URL takes no path, query or fragment ("${tail}")`);
  if (hostport === '' || hostport.startsWith(':')) throw envError('the proxy host is missing');
  if (!hostport.startsWith('[') && hostport.split(':').length > 2) {
    throw envError('an IPv6 proxy address goes in brackets: http://[2001:db8::1]:3128');
  }
  let addr;
  try {
    addr = parseAddr(hostport);
  } catch (err) {
    throw envError(err instanceof AddrError ? err.message : String(err));
  }
  const port = addr.port ?? DEFAULT_PORTS[protocol];
  const loopbackNames = new Set(['localhost', '127.0.0.1', '::1']);
  if (loopbackNames.has(addr.host)) {
    throw new GatewayError(
      'GW_ERR_DIAL_PROXY_LOOPBACK',
      `${source}="${redactUserinfo(raw)}": the proxy host cannot be ${isIP(addr.host) ? addr.host : 'localhost'}`,
      { details: { variable: source } },
    );
  }
  let username: string | undefined;
  let password: string | undefined;
  let shownUserinfo = '';
  if (userinfo !== undefined) {
    const colon = userinfo.indexOf(':');
    const rawUser = colon < 0 ? userinfo : userinfo.slice(0, colon);
    const rawPass = colon < 0 ? undefined : userinfo.slice(colon + 1);
    try {
      username = decodeURIComponent(rawUser);
      password = rawPass === undefined ? undefined : decodeURIComponent(rawPass);
    } catch {
      throw envError('the user name or password has a bad percent-encoding');
    }
    shownUserinfo = `${rawUser}${rawPass === undefined ? '' : `:${REDACTED}`}@`;
    if (protocol.startsWith('socks')) checkSocksCredentials(username, password ?? '', envError);
  }
  const display = `${protocol}://${shownUserinfo}${formatHostPort(addr.host, port)}`;
  return {
    protocol,
    host: addr.host,
    port,
    ...(username === undefined ? {} : { username }),
    ...(password === undefined ? {} : { password }),
    display,
    source,
  };
}

/** RFC 1929 carries a user name of 1 to 255 bytes and a password of up to 255. */
function checkSocksCredentials(username: string, password: string, envError: (why: string) => GatewayError): void {
  const user = Buffer.byteLength(username, 'utf8');
  if (user < 1 || user > 255) throw envError(`a SOCKS5 user name is 1 to 255 bytes (this one is ${user})`);
  if (Buffer.byteLength(password, 'utf8') > 255) throw envError('a SOCKS5 password is at most 255 bytes');
}

/**
 * A second name for the destination of a dial, which NO_PROXY may list instead of its address. The Kubernetes
 * Service's dial of an API server has one: kube.<cluster_name>.local:443 (kubeApiAlias below).
 */
export interface DialAlias {
  host: string;
  port: number;
  /** What the alias names, for the reasons shown: "the name of cluster x's Kubernetes API". */
  what: string;
  /** What the real target is, for the reasons shown: "the Kubernetes API server". */
  targetWhat: string;
}

/** One NO_PROXY check of a dial with an alias: the name checked and the entry that exempts it, or null. */
export interface NoProxyCheck {
  /** host:port checked. */
  target: string;
  what: string;
  entry: string | null;
}

/**
 * The Kubernetes Service's dial of an API server (kube_service.clusters[].api_server, an https:// URL, or a
 * host[:port]): a TLS dial of the gateway's own kind, port 443 unless given.
 */
export function kubeApiTarget(apiServer: string): DialTarget {
  const authority = /^[a-z][a-z0-9+.-]*:\/\//i.test(apiServer) ? urlAuthority(apiServer) : apiServer;
  try {
    const { host, port } = parseAddr(authority ?? '');
    return { kind: 'gateway', host, port: port ?? 443, text: formatHostPort(host, port ?? 443) };
  } catch (err) {
    const hint = err instanceof AddrError && err.hint ? { hint: err.hint } : {};
    throw new GatewayError('GW_ERR_DIAL_BAD_TARGET', `bad Kubernetes API server "${apiServer}": ${err instanceof Error ? err.message : String(err)}`, { details: { target: apiServer }, ...hint });
  }
}

/**
 * kube.<cluster_name>.local:443: the name operators put in NO_PROXY so that the Kubernetes Service reaches its
 * local cluster directly (docs/dialing.md, rule 5). Compared as text, whatever the cluster is called.
 */
export function kubeApiAlias(clusterName: string): DialAlias {
  return { host: `kube.${clusterName.toLowerCase()}.local`, port: 443, what: `the name of cluster ${clusterName}'s Kubernetes API`, targetWhat: 'the Kubernetes API server' };
}

/**
 * Decides how to reach target under env (process.env by default, read on every call). With an alias the target
 * is dialled directly when NO_PROXY exempts either its address or the alias; the decision then carries both
 * checks.
 */
export function selectProxy(target: DialTarget | string, env: Env = process.env, alias?: DialAlias): ProxyDecision {
  const t = typeof target === 'string' ? parseTarget(target) : target;
  if (isLoopbackHost(t.host)) {
    return { target: t, proxy: null, source: null, reason: `${t.host} is a loopback target, which is never proxied`, warnings: [] };
  }
  const names = PROXY_VARS[t.kind];
  const wpad = wpadSpec(env);
  const chosen = firstSet(env, names) ?? (wpad ? { name: wpad.source, value: 'wpad' } : undefined);
  if (!chosen) {
    return { target: t, proxy: null, source: null, reason: `none of ${names.join(', ')} is set`, warnings: [] };
  }
  const pac = pacOf(chosen, wpad);
  const proxy = pac ? null : parseProxyValue(chosen.value, chosen.name);
  const noProxyVar = firstSet(env, ['NO_PROXY', 'no_proxy']);
  const list = parseNoProxy(noProxyVar?.value);
  const match = (host: string, port: number) => (noProxyVar ? matchNoProxy(list, host, port) : undefined);
  const where = formatHostPort(t.host, t.port);
  const whatTarget = alias ? `${alias.targetWhat} ${where}` : where;
  const exempt = match(t.host, t.port);
  const aliasWhere = alias ? formatHostPort(alias.host, alias.port) : '';
  const aliasMatch = alias ? match(alias.host, alias.port) : undefined;
  const aliasExempt = exempt ? undefined : aliasMatch;
  const checks: NoProxyCheck[] | undefined = alias
    ? [
        { target: where, what: alias.targetWhat, entry: exempt?.text ?? null },
        { target: aliasWhere, what: alias.what, entry: aliasMatch?.text ?? null },
      ]
    : undefined;
  const base = { target: t, warnings: list.warnings, ...(checks ? { checks } : {}) };
  const varName = noProxyVar?.name ?? 'NO_PROXY';
  if (exempt?.kind === 'all') return { ...base, proxy: null, source: varName, reason: `${varName} contains "*", which turns proxying off` };
  if (exempt) return { ...base, proxy: null, source: varName, reason: `${varName} entry "${exempt.text}" matches ${whatTarget}` };
  if (aliasExempt && alias) {
    return { ...base, proxy: null, source: varName, reason: `${varName} entry "${aliasExempt.text}" matches ${aliasWhere}, ${alias.what} (${where} itself is not exempt)` };
  }
  const unmatched = noProxyVar ? `no ${noProxyVar.name} entry matches ${whatTarget}${alias ? ` or ${aliasWhere}, ${alias.what}` : ''}` : 'NO_PROXY is not set';
  if (pac) return { ...base, proxy: null, pac, source: chosen.name, reason: `${pacNamed(pac)} and ${unmatched}` };
  const spec = proxy!; // no PAC: parseProxyValue gave the proxy (or threw)
  const kind = spec.protocol.startsWith('socks') ? ` to ${describeProxyKind(spec.protocol)}` : '';
  return { ...base, proxy: spec, source: chosen.name, reason: `${chosen.name} is set${kind} and ${unmatched}` };
}

/** The PAC the chosen variable names: a pac+ value, or WPAD when only GATEWAY_WPAD is set. */
function pacOf(chosen: { name: string; value: string }, wpad: PacSpec | undefined): PacSpec | undefined {
  if (wpad && chosen.name === wpad.source) return wpad;
  return isPacValue(chosen.value) ? parsePacValue(chosen.value, chosen.name) : undefined;
}

function pacNamed(pac: PacSpec): string {
  return pac.kind === 'wpad' ? `${pac.source} asks for WPAD (no proxy variable is set)` : `${pac.source} names the PAC file ${pac.display}`;
}
