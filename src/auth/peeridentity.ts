/**
 * Whose certificate this is: the identity a TLS peer's client certificate names, or one a Proxy forwarded, each
 * checked against the cluster's trust (the CA that must have signed that kind, this cluster's name, valid now).
 * Used by the Auth API router (api.ts) and by the Proxy wherever a connection carries a client certificate
 * (routed database, app and Kubernetes connections, peering): the Proxy reads identities here, not through the
 * Auth Service's HTTP router.
 */
import type { IncomingMessage } from 'node:http';
import { X509Certificate } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import { GatewayError } from '../errors.js';
import { CLOCK_SKEW_MS, identityFromCert, type Identity } from './pki.js';
import type { ClusterTrust } from './proxyauth.js';

/** Extended key usage id-kp-clientAuth: user certificates carry it (pki/tls.ts). */
const CLIENT_AUTH_EKU = '1.3.6.1.5.5.7.3.2';

/** The kind of identity a certificate names (user, host...), or undefined when it names none of ours. */
function kindOf(raw: Buffer): string | undefined {
  try {
    return identityFromCert(raw).kind;
  } catch {
    return undefined;
  }
}

/** The caller's identity from its client certificate, checked against the CA that must have signed that kind. */
export function peerIdentity(trust: ClusterTrust, req: IncomingMessage): Identity {
  return peerIdentityOf(trust, req.socket as TLSSocket);
}

/** The same for any TLS socket (routed database, app and kube connections). */
export function peerIdentityOf(trust: ClusterTrust, socket: TLSSocket): Identity {
  const unauthenticated = (why: string) =>
    new GatewayError('GW_ERR_AUTH_UNAUTHENTICATED', `no valid client certificate from this cluster: ${why}`, {
      hint: "Sign in with 'gwsh login', or on the Auth Service's machine run gwctl with access to its data directory.",
    });
  if (typeof socket.getPeerCertificate !== 'function') throw unauthenticated('not a TLS connection');
  const peer = socket.getPeerCertificate(true);
  if (!peer || !peer.raw) throw unauthenticated('none was presented');
  if (!socket.authorized) {
    if (String(socket.authorizationError) === 'CERT_HAS_EXPIRED' && kindOf(peer.raw) === 'user') {
      // A user whose certificate ran out: the fix is a new login, not the generic advice.
      throw new GatewayError('GW_ERR_CLIENT_CERT_EXPIRED', `your user certificate has expired (valid until ${peer.valid_to})`, {
        hint: "Run 'gwsh login' again for a fresh certificate.",
      });
    }
    throw unauthenticated(String(socket.authorizationError ?? 'not signed by this cluster'));
  }
  const identity = identityFromCert(peer.raw);
  const expectedCa = identity.kind === 'host' ? trust.host.tls.certPem : trust.user.tls.certPem;
  const issuer = peer.issuerCertificate;
  if (!issuer?.raw || new X509Certificate(issuer.raw).fingerprint256 !== new X509Certificate(expectedCa).fingerprint256) {
    throw unauthenticated(`a ${identity.kind} certificate must be signed by the ${identity.kind === 'host' ? 'host' : 'user'} CA`);
  }
  if (identity.cluster !== trust.clusterName) throw unauthenticated(`certificate is for cluster "${identity.cluster}"`);
  // notBefore is the issue time moved back by the clock-skew allowance (pki/tls.ts).
  const issuedAt = Date.parse(peer.valid_from) + CLOCK_SKEW_MS;
  return Number.isNaN(issuedAt) ? identity : { ...identity, issuedAt };
}

/**
 * The identity of a certificate a Proxy forwarded, verified here as if it had been presented to this server:
 * signed by the CA of its kind, valid now, of this cluster. Never trusted because a Proxy sent it.
 */
export function forwardedIdentity(trust: ClusterTrust, der: Buffer): Identity {
  const refuse = (why: string) =>
    new GatewayError('GW_ERR_AUTH_UNAUTHENTICATED', `the client certificate forwarded by the Proxy is not valid here: ${why}`, {
      hint: "Sign in again with 'gwsh login'; the Proxy passes on the certificate the client presented.",
    });
  let cert: X509Certificate;
  let identity: Identity;
  try {
    cert = new X509Certificate(der);
    identity = identityFromCert(der);
  } catch (err) {
    throw refuse((err as Error).message);
  }
  // Only users come through a Proxy's web port: a host or admin certificate (public, and seen by every Proxy)
  // forwarded here would let one Proxy act as another Proxy, an agent or the admin.
  if (identity.kind !== 'user') throw refuse(`a ${identity.kind} certificate cannot come through a Proxy; only user certificates do`);
  if (!cert.keyUsage?.includes(CLIENT_AUTH_EKU)) throw refuse('the certificate is not for client authentication');
  const ca = new X509Certificate(trust.user.tls.certPem);
  if (!cert.checkIssued(ca) || !cert.verify(ca.publicKey)) throw refuse('not signed by the user CA of this cluster');
  const now = Date.now();
  if (now < Date.parse(cert.validFrom) || now > Date.parse(cert.validTo)) throw refuse(`valid from ${cert.validFrom} to ${cert.validTo}`);
  if (identity.cluster !== trust.clusterName) throw refuse(`certificate is for cluster "${identity.cluster}"`);
  return { ...identity, issuedAt: Date.parse(cert.validFrom) + CLOCK_SKEW_MS };
}
