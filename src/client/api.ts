/**
 * Calls to the gateway's HTTPS API (the Proxy's web port or the Auth API on 3025) through the Dialer, so they
 * honour HTTPS_PROXY / NO_PROXY. Server errors come back as GatewayErrors with the server's code.
 */
import { Dialer } from '../dial/dialer.js';
import { fetchThroughDialer } from '../dial/agent.js';
import { inspectionError, issued, UNTRUSTED_HINTS } from '../dial/tlsverify.js';
import type { PresentedCert } from '../stream/tls.js';
import { X509Certificate } from 'node:crypto';
import { AddrError, formatHostPort, parseAddr } from '../addr.js';
import { GatewayError, isErrorCode } from '../errors.js';
import { checkServerIdentity as checkServerName, type PeerCertificate } from 'node:tls';
import { bearsIdentity, identityFromCert, pinMatches, type Identity } from '../auth/pki.js';
import type { PublicCas } from '../wire/certs.js';

export interface ApiClientOptions {
  /** host:port of the Proxy's web port or the Auth API. */
  address: string;
  dialer?: Dialer;
  /** Host CA (PEM) the server certificate must chain to; omit to use the system's CAs. */
  ca?: string;
  /** Client certificate and key for calls that need an identity. */
  cert?: string;
  key?: string;
  timeoutMs?: number;
  /** Which service answers at address, for the hints of certificate errors: the Proxy unless said otherwise. */
  server?: 'proxy' | 'auth';
}

export class ApiClient {
  readonly address: string;
  private readonly dialer: Dialer;

  constructor(private readonly options: ApiClientOptions) {
    this.address = normalizeAddress(options.address);
    this.dialer = options.dialer ?? new Dialer();
  }

  /** Which service answers at address: the Auth API or a Proxy's web port. */
  get server(): 'proxy' | 'auth' {
    return this.options.server ?? 'proxy';
  }

  /** The same identity and trust against a Proxy's web port at `address` (gwctl probe --proxy). */
  at(address: string): ApiClient {
    return new ApiClient({ ...this.options, address, server: 'proxy' });
  }

  async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const text = body === undefined ? undefined : JSON.stringify(body);
    const res = await fetchThroughDialer(`https://${this.address}${path}`, {
      dialer: this.dialer,
      method,
      headers: text === undefined ? {} : { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) },
      ...(text === undefined ? {} : { body: text }),
      ...(this.options.ca === undefined ? {} : { ca: this.options.ca }),
      ...(this.options.cert === undefined ? {} : { cert: this.options.cert, key: this.options.key }),
      // Verified against the cluster's host CA: the certificate must also say it is the member asked for (the Auth
      // Service, or a Proxy), not any host of the cluster. With the system's CAs only, no host certificate passes.
      ...(this.options.ca !== undefined ? { checkServerIdentity: this.server === 'auth' ? authServerIdentity : proxyServerIdentity } : {}),
      timeoutMs: this.options.timeoutMs ?? 30_000,
      // A Proxy verified against the cluster's CA: past a TLS-inspecting proxy through the upgrade (src/dial/fallback.ts).
      clusterProxy: this.server === 'proxy' && this.options.ca !== undefined,
      tlsPeer: {
        server: this.options.server ?? 'proxy',
        // With the cluster CA (pinned at login or join) an untrusted certificate is not this cluster's; without
        // it, only the system's CAs were asked, and a pin is what is missing.
        untrustedHint: this.options.ca === undefined ? UNTRUSTED_HINTS.noPin : UNTRUSTED_HINTS.clusterCa(this.address),
      },
    });
    let payload: unknown;
    try {
      payload = JSON.parse(res.body.toString('utf8'));
    } catch {
      throw new GatewayError('GW_ERR_API_BAD_RESPONSE', `${this.address}${path} answered ${res.status} with a body that is not JSON`, {
        hint: 'The address may not be a gateway Proxy or Auth Service.',
      });
    }
    if (res.status >= 400) {
      const e = (payload as { error?: { code?: string; message?: string; hint?: string } }).error ?? {};
      const code = isErrorCode(e.code) ? e.code : 'GW_ERR_API_BAD_RESPONSE';
      throw new GatewayError(code, e.message ?? `HTTP ${res.status}`, { ...(e.hint ? { hint: e.hint } : {}), details: { status: res.status } });
    }
    return payload as T;
  }
}

/** The cluster members a client talks to, and the system role each one's host certificate must carry. */
export type MemberRole = 'proxy' | 'auth';

const MEMBER_NAMES: Record<MemberRole, string> = { proxy: "a Proxy's", auth: "an Auth Service's" };

/**
 * Whether a certificate that chained to the cluster's host CA is a certificate of the member expected: a host
 * certificate of that cluster member with its system role (proxy, auth). Every host certificate (an agent's, a
 * Proxy's, the Auth Service's) chains to the same host CA and may hold any name its join asked for, so the chain
 * and the name alone do not tell a Proxy from an agent (docs/security.md, "Who each cluster member is"). Returns
 * the identity, or a GW_ERR_TLS_WRONG_ROLE error naming what the certificate is instead.
 */
export function memberIdentity(host: string, raw: Buffer | undefined, role: MemberRole): Identity | GatewayError {
  const refuse = (what: string) =>
    new GatewayError('GW_ERR_TLS_WRONG_ROLE', `the certificate at ${host} ${what}, not ${MEMBER_NAMES[role]}: it is not the ${role === 'proxy' ? 'Proxy' : 'Auth Service'} of this cluster; nothing was sent to it`, {
      hint: `Something between this machine and ${host} (its DNS name, a hosts file, HTTPS_PROXY or a TLS-inspecting proxy) leads to another member of the cluster, such as an agent, that holds a certificate with this name. Check where ${host} resolves and the proxy settings; an agent may have joined with this name before the Auth Service refused that (gwctl get nodes lists the names agents hold).`,
      details: { host, expected_role: role },
    });
  let identity: Identity;
  try {
    identity = identityFromCert(raw);
  } catch (err) {
    return refuse(`carries no cluster identity (${(err as Error).message})`);
  }
  if (identity.kind === 'host' && identity.roles.includes(role)) return identity;
  return refuse(`is a ${identity.kind} certificate with the roles ${identity.roles.join(', ') || 'none'}`);
}

/** A checkServerIdentity for tls: Node's name check, then memberIdentity for role. */
export function memberServerIdentity(role: MemberRole): (host: string, cert: PeerCertificate) => Error | undefined {
  return (host, cert) => {
    const nameError = checkServerName(host, cert);
    if (nameError) return nameError;
    const found = memberIdentity(host, cert.raw, role);
    return found instanceof GatewayError ? found : undefined;
  };
}

/**
 * The same check for a client that trusts CAs outside the cluster besides its host CA: the upgraders asking a
 * Proxy's version server (the system's CAs, the operator's GATEWAY_UPGRADE_CA_FILE or --ca-file, and the agent's
 * host CA). Node's name check; then, when the certificate bears the gateway identity, memberIdentity for role, so
 * an agent's certificate under the Proxy's name is refused. A certificate without it was not issued by a cluster
 * CA (every one of theirs has it): a web certificate from a public CA (proxy_service.https_keypairs) or the
 * operator's own CA. It is accepted on chain and name as any HTTPS server is, because it carries no role to check,
 * and no member's certificate can pass as one (docs/security.md, "How each party checks").
 */
export function memberOrOutsideServerIdentity(role: MemberRole): (host: string, cert: PeerCertificate) => Error | undefined {
  const member = memberServerIdentity(role);
  return (host, cert) => (bearsIdentity(cert.raw) ? member(host, cert) : checkServerName(host, cert));
}

/**
 * For a server that is never a member of the cluster, reached trusting the cluster's host CA among others (the
 * release download location of gateway-upgrade's tarball path, which trusts the agent's host CA): Node's name
 * check; then a certificate that bears the gateway identity is refused. Any host that joined may hold a
 * certificate of that CA under a name the Auth Service does not reserve, such as the download location's, and
 * there it would supply the software itself. `what` names the server in the message ("the release download server").
 */
export function outsideServerIdentity(what: string): (host: string, cert: PeerCertificate) => Error | undefined {
  return (host, cert) => {
    const nameError = checkServerName(host, cert);
    if (nameError || !bearsIdentity(cert.raw)) return nameError;
    let holder = 'a member of the cluster';
    try {
      const id = identityFromCert(cert.raw);
      holder = `a ${id.kind} of the cluster (roles: ${id.roles.join(', ') || 'none'})`;
    } catch {
      // bears the identity's OID without a readable identity: still the cluster's, still refused
    }
    return new GatewayError('GW_ERR_TLS_WRONG_ROLE', `the certificate at ${host} belongs to ${holder}, not to ${what}: no member of the cluster is ${what}; nothing was sent to it`, {
      hint: `Something between this machine and ${host} (its DNS name, a hosts file, HTTPS_PROXY or a TLS-inspecting proxy) leads to a host of the cluster that holds a certificate with this name. Check where ${host} resolves and the proxy settings; gwctl get nodes lists the names agents hold.`,
      details: { host },
    });
  };
}

/**
 * For a server that is a cluster member only when it is a Proxy, and otherwise never one (the release download
 * location, which a Proxy may be: its artifact route relays releases): a certificate of the cluster's CA passes when
 * it is a Proxy's, chain, name and role (memberServerIdentity('proxy')); any other is outsideServerIdentity's, so an
 * agent's certificate under that name is still refused with GW_ERR_TLS_WRONG_ROLE and `what` in the message.
 */
export function proxyOrOutsideServerIdentity(what: string): (host: string, cert: PeerCertificate) => Error | undefined {
  const proxy = memberServerIdentity('proxy');
  const outside = outsideServerIdentity(what);
  return (host, cert) => (bearsIdentity(cert.raw) && proxy(host, cert) === undefined ? undefined : outside(host, cert));
}

/**
 * The server-certificate check for the Auth API: the name check Node makes, and then the certificate's identity
 * must be a host of the cluster with the role auth. Any host certificate (an agent's, a Proxy's) chains to the
 * same host CA, so without this an agent with a network position could answer as the Auth Service.
 */
export const authServerIdentity = memberServerIdentity('auth');

/**
 * The same for a Proxy (its web port, its TLS routes, the agents' tunnel on it): role proxy. Only where the
 * client verifies against the cluster's host CA: a web certificate from a public CA (proxy_service.https_keypairs)
 * carries no identity, and no agent's certificate chains to the system's CAs.
 */
export const proxyServerIdentity = memberServerIdentity('proxy');

/** "host" → "host:443"; validates the form. */
export function normalizeAddress(address: string, defaultPort = 443): string {
  try {
    const { host, port } = parseAddr(address);
    return formatHostPort(host, port ?? defaultPort);
  } catch (err) {
    const hint = err instanceof AddrError ? err.hint : undefined;
    throw new GatewayError('GW_ERR_USAGE', `"${address}" is not a host:port address: ${(err as Error).message}`, hint ? { hint } : {});
  }
}

/** An Auth API address: "host" → "host:3025". */
export function normalizeAuthAddress(address: string): string {
  return normalizeAddress(address, 3025);
}

/** Whether the CA in pem issued cert (false for a PEM that does not parse). */
function issuedByPem(pem: string, cert: PresentedCert | undefined): boolean {
  if (!cert) return false;
  try {
    return issued(new X509Certificate(pem), cert);
  } catch {
    return false;
  }
}

/**
 * Fetches the cluster's CAs over an unverified TLS connection and accepts them only if the host CA matches the
 * pin. Nothing secret is sent on that connection; everything after it verifies the server against the pinned CA.
 */
export async function fetchPinnedCas(address: string, pin: string, dialer?: Dialer): Promise<PublicCas> {
  const addr = normalizeAddress(address);
  const res = await fetchThroughDialer(`https://${addr}/webapi/ca`, { dialer: dialer ?? new Dialer(), rejectUnauthorized: false, timeoutMs: 30_000, withPeer: true });
  // An answer that is not the pinned cluster's may be a TLS-inspecting proxy's (its error page, or the CAs of a
  // certificate it minted): said as such when the certificate it came with looks like one, was not issued by the
  // CA that came in the answer, and came without the pinned CA.
  const inspected = (fetchedCa?: string) => {
    if (!res.peer) return undefined;
    if (fetchedCa !== undefined && issuedByPem(fetchedCa, res.peer.chain[0])) return undefined;
    // A Proxy sends its host CA along with its certificate: the pinned CA in the chain is the cluster's own answer.
    if (res.peer.chain.some((c) => pinMatches(new X509Certificate(c.raw).toString(), pin))) return undefined;
    const outcome = 'its answer was not used (only the request for the public CAs, which carries nothing secret, was sent)';
    return inspectionError({ address: addr, server: 'proxy' }, res.peer.chain, res.peer.route, undefined, undefined, outcome);
  };
  let cas: PublicCas;
  try {
    cas = JSON.parse(res.body.toString('utf8')) as PublicCas;
  } catch {
    throw inspected() ?? new GatewayError('GW_ERR_API_BAD_RESPONSE', `${addr} did not answer /webapi/ca with JSON`, { hint: 'Check that the address is the Proxy (or Auth Service) of the cluster.' });
  }
  if (typeof cas.host_ca !== 'string') throw inspected() ?? new GatewayError('GW_ERR_API_BAD_RESPONSE', `${addr} sent no host CA`);
  if (!pinMatches(cas.host_ca, pin)) {
    throw (
      inspected(cas.host_ca) ??
      new GatewayError('GW_ERR_AUTH_PIN_MISMATCH', `the CA of ${addr} does not match the pin ${pin}`, {
        hint: "Check the pin ('gwctl status' on the cluster prints it) and that the address is the right cluster; nothing was sent to it.",
      })
    );
  }
  return cas;
}
