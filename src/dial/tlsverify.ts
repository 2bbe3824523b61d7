/**
 * What a failed server-certificate check means, said once for every client that verifies one (the gateway API
 * client, HTTPS through the Dialer, the reverse tunnel, gwsh's resource connections, the Kubernetes dial, the
 * upgraders). Node's verification error is turned into one of three codes, each with the fix for the server
 * that was dialled:
 *
 *   GW_ERR_TLS_NAME_MISMATCH   the certificate is trusted but names other hosts than the address dialled; the
 *                              message lists the DNS and IP names it holds
 *   GW_ERR_TLS_CERT_EXPIRED    the certificate is outside its validity period
 *   GW_ERR_CLIENT_UNTRUSTED    no CA this side trusts signed it (no pin given, or another cluster's); the message
 *                              names the issuer and says that the dial was direct when it was
 *   GW_ERR_TLS_INSPECTED       the same, on a dial through a proxy, with a certificate some other CA issued (not
 *                              a self-signed one): a TLS-inspecting proxy answered in the server's place; the
 *                              message names the CA it signs with, the hint the splice exception or NO_PROXY
 *
 * A certificate that passes these but is not the cluster member's expected (GW_ERR_TLS_WRONG_ROLE, src/client/api.ts
 * memberIdentity) comes back from the caller's check as that error already, and passes through unchanged.
 *
 * A CA that does not match a --ca-pin is found earlier, before anything is verified (GW_ERR_AUTH_PIN_MISMATCH in
 * src/client/api.ts). Pure: no I/O. What was presented and how the socket was dialled come with the error
 * (src/stream/tls.ts handshakeFailure, src/dial/dialer.ts dialRoute); a refused certificate is never accepted.
 *
 * The same judgement serves `gateway dial-plan --probe` (probeVerdict): whose CA issued what a path presents.
 */
import { X509Certificate } from 'node:crypto';
import type { PeerCertificate } from 'node:tls';
import { formatHostPort, isIpLiteral, isLoopbackHost, parseAddr } from '../addr.js';
import { GatewayError } from '../errors.js';
import { handshakeFailure, type PresentedCert } from '../stream/tls.js';
import { IDENTITY_OIDS_DER } from '../wire/certs.js';
import { dialRoute, type DialRoute } from './dialer.js';

/** Who answered: decides which setting the hints name. */
export type TlsServerKind = 'proxy' | 'auth' | 'kube-api' | 'server';

export interface TlsPeer {
  /** host:port as it was dialled. */
  address: string;
  server: TlsServerKind;
  /** For kube-api: the cluster's name in kube_service.clusters. */
  name?: string;
  /** What to do when no trusted CA signed the certificate: that depends on how the caller got its trust. */
  untrustedHint?: string;
  /**
   * The caller also accepts certificates of roots the operator gives (the upgraders' downloads): then trusting an
   * inspecting proxy's root is a fix too, and the hint says how (untrustedHint). Mutual TLS clients never do.
   */
  acceptsOperatorRoots?: boolean;
}

/** Hints for an untrusted certificate, by how the caller trusts the server. */
export const UNTRUSTED_HINTS = {
  noPin: "Pass the cluster's CA pin with --ca-pin sha256:... ('gwctl status' on the cluster prints it), so that the cluster CA is trusted after it is checked against the pin.",
  clusterCa: (address: string) =>
    `The certificate of ${address} is not signed by the cluster CA this side trusts. Check that ${address} is this cluster's Proxy (a TLS-inspecting proxy in between presents its own certificate: exempt the address with NO_PROXY); if the cluster was set up again with new CAs, sign in again with 'gwsh login --ca-pin' or join again with a new token and --ca-pin.`,
} as const;

const UNTRUSTED_CODES = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_SIGNATURE_FAILURE',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
]);
const EXPIRED_CODES = new Set(['CERT_HAS_EXPIRED', 'CERT_NOT_YET_VALID']);
const NAME_CODE = 'ERR_TLS_CERT_ALTNAME_INVALID';

/** The codes this module produces. */
export const TLS_VERIFY_CODES = ['GW_ERR_TLS_NAME_MISMATCH', 'GW_ERR_TLS_CERT_EXPIRED', 'GW_ERR_CLIENT_UNTRUSTED', 'GW_ERR_TLS_WRONG_ROLE', 'GW_ERR_TLS_INSPECTED'] as const;

export function isTlsVerifyError(err: unknown): err is GatewayError {
  return err instanceof GatewayError && (TLS_VERIFY_CODES as readonly string[]).includes(err.code);
}

/** At most this many names of each kind are listed in a message. */
const MAX_NAMES = 20;

/** The DNS and IP subject alternative names of a peer certificate, as Node reports them. */
export function certNames(cert: Pick<PeerCertificate, 'subjectaltname'> | undefined): { dns: string[]; ips: string[] } {
  const dns: string[] = [];
  const ips: string[] = [];
  for (const entry of (cert?.subjectaltname ?? '').slice(0, 64 * 1024).split(', ')) {
    const m = /^(DNS|IP Address):"?(.*?)"?$/.exec(entry);
    if (!m) continue;
    if (m[1] === 'DNS') dns.push(m[2]!.toLowerCase());
    else ips.push(compressIp(m[2]!));
  }
  return { dns, ips };
}

/** Node prints IPv6 SANs uncompressed (0:0:0:0:0:0:0:1); URL() gives the canonical form (::1). */
function compressIp(ip: string): string {
  if (!ip.includes(':')) return ip;
  try {
    return new URL(`http://[${ip}]/`).hostname.slice(1, -1);
  } catch {
    return ip;
  }
}

function listNames(names: { dns: string[]; ips: string[] }): string {
  const show = (list: string[]) => (list.length > MAX_NAMES ? `${list.slice(0, MAX_NAMES).join(', ')} and ${list.length - MAX_NAMES} more` : list.join(', '));
  const parts = [
    ...(names.dns.length > 0 ? [`DNS names ${show(names.dns)}`] : []),
    ...(names.ips.length > 0 ? [`IP addresses ${show(names.ips)}`] : []),
  ];
  return parts.length > 0 ? `it holds ${parts.join(' and ')}` : 'it holds no DNS or IP names';
}

/**
 * A name of the certificate to suggest dialling instead: a fully qualified name first (a public_addr rather than
 * a bare node name), then an IP address, loopback ones last; never a wildcard.
 */
function suggestion(names: { dns: string[]; ips: string[] }, port: number): string | undefined {
  const dns = names.dns.filter((n) => !n.startsWith('*.'));
  const order = [...dns.filter((n) => n.includes('.')), ...names.ips, ...dns.filter((n) => !n.includes('.'))];
  const pick = order.find((n) => !isLoopbackHost(n)) ?? order[0];
  return pick === undefined ? undefined : formatHostPort(pick, port);
}

function splitAddress(address: string): { host: string; port: number } {
  try {
    const a = parseAddr(address);
    return { host: a.host, port: a.port ?? 443 };
  } catch {
    return { host: address, port: 443 };
  }
}

function nameHint(peer: TlsPeer, host: string, port: number, instead: string | undefined): string {
  const dialOther = instead ? ` Or dial a name the certificate holds, e.g. ${instead}.` : '';
  const kind = isIpLiteral(host) ? 'IP address' : 'name';
  switch (peer.server) {
    case 'proxy':
      return `Set proxy_service.public_addr on the Proxy to include ${formatHostPort(host, port)} and restart the Proxy: it issues its certificate when it starts, for its node name, its listen address and every public_addr (with proxy_service.https_keypairs, reissue that certificate with the ${kind} ${host} instead).${dialOther}`;
    case 'auth':
      return `Set auth_service.public_addr on the Auth Service to include ${formatHostPort(host, port)} and restart it: it issues its certificate when it starts, for its node name, its listen address and every public_addr.${dialOther}`;
    case 'kube-api':
      return `Write kube_service.clusters[].api_server of "${peer.name ?? '?'}" with a name the API server's certificate holds${instead ? `, e.g. https://${instead}` : ''}, or reissue the API server's certificate with the ${kind} ${host} among its names.`;
    default:
      return `Dial a name the certificate holds${instead ? `, e.g. ${instead}` : ''}, or have the server's certificate reissued with the ${kind} ${host} among its names.`;
  }
}

function expiredHint(peer: TlsPeer): string {
  switch (peer.server) {
    case 'proxy':
      return "Check the clocks of this machine and of the Proxy (date -u). The Proxy issues its certificate when it starts, so restarting it issues a fresh one (with proxy_service.https_keypairs, renew that certificate).";
    case 'auth':
      return 'Check the clocks of this machine and of the Auth Service (date -u). The Auth Service issues its certificate when it starts, so restarting it issues a fresh one.';
    case 'kube-api':
      return `Check the clocks of this machine and of the Kubernetes API server of "${peer.name ?? '?'}", and renew the API server's certificate if it has run out.`;
    default:
      return "Check the clocks of this machine and of the server (date -u), and renew the server's certificate if it has run out.";
  }
}

function untrustedHint(peer: TlsPeer): string {
  if (peer.untrustedHint) return peer.untrustedHint;
  if (peer.server === 'kube-api') return `Set kube_service.clusters[].ca_file of "${peer.name ?? '?'}" to the CA that signs the API server's certificate.`;
  if (peer.server === 'server') return "Trust the CA that signs the server's certificate (a CA file), or check that the address is the right server.";
  return UNTRUSTED_HINTS.noPin;
}

/** The TLS verification error behind err (err itself or a cause a few levels down), if there is one. */
function verifyCause(err: unknown): (Error & { code: string; cert?: PeerCertificate }) | undefined {
  let e: unknown = err;
  for (let depth = 0; depth < 4 && e instanceof Error; depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === 'string' && (code === NAME_CODE || EXPIRED_CODES.has(code) || UNTRUSTED_CODES.has(code))) {
      return e as Error & { code: string; cert?: PeerCertificate };
    }
    e = e.cause;
  }
  return undefined;
}

/**
 * The GatewayError for a failed server-certificate check while talking to peer, or undefined when err is not
 * one (then the caller reports err its own way).
 */
export function tlsVerifyError(err: unknown, peer: TlsPeer): GatewayError | undefined {
  if (isTlsVerifyError(err)) return err;
  const cause = verifyCause(err);
  if (!cause) return undefined;
  const { host, port } = splitAddress(peer.address);
  const details = { address: peer.address, server: peer.server, tls_code: cause.code };
  if (cause.code === NAME_CODE) {
    const names = certNames(cause.cert);
    return new GatewayError('GW_ERR_TLS_NAME_MISMATCH', `the certificate of ${peer.address} does not hold the ${isIpLiteral(host) ? 'IP address' : 'name'} ${host} that was dialled: ${listNames(names)}`, {
      hint: nameHint(peer, host, port, suggestion(names, port)),
      cause,
      details: { ...details, dns_names: names.dns.slice(0, MAX_NAMES), ip_addresses: names.ips.slice(0, MAX_NAMES) },
    });
  }
  if (EXPIRED_CODES.has(cause.code)) {
    const what = cause.code === 'CERT_HAS_EXPIRED' ? 'has expired' : 'is not valid yet';
    return new GatewayError('GW_ERR_TLS_CERT_EXPIRED', `the certificate of ${peer.address} ${what}`, { hint: expiredHint(peer), cause, details });
  }
  return untrusted(peer, cause, details);
}

/**
 * The name of the CA at the top of a presented chain: the subject of a self-issued top certificate (the root
 * itself was sent), else the issuer of the last one sent.
 */
export function chainRoot(chain: readonly PresentedCert[]): string | undefined {
  const top = chain[chain.length - 1];
  if (!top) return undefined;
  return top.selfIssued ? top.subject : top.issuer;
}

/**
 * Whether an untrusted certificate on this route is a TLS-inspecting proxy's: the dial went through a proxy and
 * another CA issued the leaf (an inspecting proxy signs the certificates it makes with its own CA; a leaf that
 * signed itself is a server's own, the proxy only tunnelled to it), and the leaf is not a gateway certificate.
 */
export function looksInspected(chain: readonly PresentedCert[], route: DialRoute | undefined): boolean {
  // A leaf that carries a gateway identity is a cluster's own certificate (another cluster's, or an old CA's):
  // inspecting proxies forge the name, not our extension. Searched as bytes: this only names the error.
  return route?.proxy != null && chain.length > 0 && !chain[0]!.selfIssued && !IDENTITY_OIDS_DER.some((o) => chain[0]!.raw.includes(o));
}

function inspectedHint(peer: TlsPeer, host: string, root: string): string {
  const fix =
    `Have the proxy leave TLS to ${host} alone: on squid, "acl gateway_proxy ssl::server_name ${host}" and "ssl_bump splice gateway_proxy" before its bump rule ` +
    `(appliances call it a TLS inspection bypass or do-not-decrypt rule); or, where this machine may reach ${host} without the proxy, add ${host} to NO_PROXY.`;
  if (peer.server === 'proxy' && !peer.acceptsOperatorRoots) {
    return `Give the root certificate of ${root} (your organisation's inspecting CA) in GATEWAY_PROXY_CA_FILE or NODE_EXTRA_CA_CERTS (an agent: gateway.proxy_ca_file): the cluster's mutual TLS then goes, end to end, inside a WebSocket upgrade on ${host}'s web address, and the proxy sees only ciphertext; verification is never turned off. Or: ${fix}`;
  }
  if (peer.server === 'auth' && !peer.acceptsOperatorRoots) {
    return `${fix} The cluster's mutual TLS cannot pass through inspection, and the Auth API has no upgrade transport (a Proxy's web address has: use the Proxy's address), so trusting ${root} does not help here and verification is never turned off.`;
  }
  return `${fix} Or, if ${root} is your organisation's root, trust it for this server: ${untrustedHint(peer)}`;
}

function presentedDetails(chain: readonly PresentedCert[]): Record<string, unknown> {
  return chain[0] ? { subject: chain[0].subject, issuer: chain[0].issuer, root: chainRoot(chain) ?? null, fingerprint256: chain[0].fingerprint256 } : {};
}

/**
 * GW_ERR_TLS_INSPECTED for a certificate refused (or, for the pinned CA fetch, found wanting) on route, when it
 * looks like an inspecting proxy's (looksInspected); undefined otherwise.
 */
export function inspectionError(
  peer: TlsPeer,
  chain: readonly PresentedCert[],
  route: DialRoute | undefined,
  cause?: Error,
  details: Record<string, unknown> = { address: peer.address, server: peer.server },
  outcome = 'it was refused and nothing was sent over it',
): GatewayError | undefined {
  const root = chainRoot(chain);
  if (!looksInspected(chain, route) || root === undefined) return undefined;
  const via = route!.proxy!;
  const { host } = splitAddress(peer.address);
  return new GatewayError(
    'GW_ERR_TLS_INSPECTED',
    `TLS to ${peer.address} is inspected by ${root}: through the proxy ${via.display} (from ${via.source}) the server presented a certificate for ${chain[0]!.subject} issued by ${chain[0]!.issuer}, not one this side trusts for ${peer.address}; ${outcome}`,
    { hint: inspectedHint(peer, host, root), ...(cause ? { cause } : {}), details: { ...details, ...presentedDetails(chain), proxy: via.display, variable: via.source } },
  );
}

function untrusted(peer: TlsPeer, cause: Error & { code: string }, details: Record<string, unknown>): GatewayError {
  const failure = handshakeFailure(cause);
  const chain = failure?.chain ?? [];
  const route = failure ? dialRoute(failure.stream) : undefined;
  const presented = presentedDetails(chain);
  const inspected = inspectionError(peer, chain, route, cause, details);
  if (inspected) return inspected;
  const issued = chain[0] ? ` (it is ${chain[0].selfIssued ? `self-signed by ${chain[0].subject}` : `${chain[0].subject}, issued by ${chain[0].issuer}`})` : '';
  const path = route === undefined ? '' : route.proxy ? `; dialled through the proxy ${route.proxy.display}` : '; dialled directly, no proxy in the path';
  return new GatewayError('GW_ERR_CLIENT_UNTRUSTED', `the certificate of ${peer.address} is not trusted: ${cause.message}${issued}${path}`, {
    hint: untrustedHint(peer),
    cause,
    details: { ...details, ...presented, ...(route ? { proxy: route.proxy?.display ?? null } : {}) },
  });
}

/** What `gateway dial-plan --probe` concludes about a presented chain. */
export interface ProbeVerdict {
  /** The leaf was issued by one of the cluster's CAs given (undefined: none given). */
  cluster: boolean | undefined;
  /** The CA at the top of the chain (chainRoot). */
  root: string | undefined;
  /** "inspected by <root>" when a cluster CA was given, the chain is not the cluster's and a proxy is in the path. */
  inspectedBy: string | undefined;
}

/** Whether ca issued cert: the issuer name (and key identifier) match and the signature verifies with the CA's key. */
export function issued(ca: X509Certificate, cert: PresentedCert): boolean {
  try {
    const x = new X509Certificate(cert.raw);
    return x.checkIssued(ca) && x.verify(ca.publicKey);
  } catch {
    return false;
  }
}

/** The probe's judgement of a chain presented on route, against the cluster CAs given (PEM, maybe none). */
export function probeVerdict(chain: readonly PresentedCert[], clusterCas: readonly string[], route: DialRoute | undefined): ProbeVerdict {
  const root = chainRoot(chain);
  if (clusterCas.length === 0 || chain.length === 0) return { cluster: undefined, root, inspectedBy: undefined };
  const cas = clusterCas.flatMap((pem) => {
    try {
      return [new X509Certificate(pem)];
    } catch {
      return [];
    }
  });
  const cluster = cas.some((ca) => issued(ca, chain[0]!));
  return { cluster, root, inspectedBy: !cluster && looksInspected(chain, route) ? root : undefined };
}
