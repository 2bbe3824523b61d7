/**
 * Whether a grant's issuer certificate (E2EGrant.x5c, src/tunnel/e2e.ts) is a Proxy of this cluster: the one check
 * both ends that take a grant from a Proxy they may hold no tunnel to make (docs/tunnels.md, "End-to-end streams").
 *
 *   the Proxy   any Proxy a stream lands on (src/proxy/e2eissuer.ts GrantIssuers: it adds a cache of the parsed
 *               certificates and that the issuer is a live Proxy now);
 *   the agent   an agent reached over Proxy peering holds no tunnel to the Proxy that issued the grant, so it has no
 *               certificate of it from a TLS handshake (src/agent/e2estream.ts: it prefers its own tunnel's).
 *
 * In this order, the first that fails is the why (each a phrase after "the grant's issuer certificate"):
 *   1. x5c is a certificate (DER, base64url);
 *   2. it was signed by the cluster's host CA (the one PEM given) and is valid now;
 *   3. its identity (src/auth/pki.ts) is a host of this cluster with the role proxy, named grant.iss: an agent's or
 *      the Auth Service's host certificate chains to the same CA and cannot sign grants.
 * Steps 1 and 2's chain and the identity follow from the bytes and the CA alone (issuerCertificate: a caller may
 * keep its result by those bytes); the validity period and the rest are checked every time (issuerRefusal).
 * The signature itself is verifyGrant's (src/tunnel/e2e.ts), with the certificate this returns.
 */
import { X509Certificate } from 'node:crypto';
import type { E2EGrant } from '../tunnel/e2e.js';
import { identityFromCert, type Identity } from './pki.js';

/** The system role a grant's issuer must hold (the peering servers' PEER_ROLE: the Proxies'). */
export const ISSUER_ROLE = 'proxy';

/** A parsed issuer certificate and the identity it names. */
export interface GrantIssuer {
  cert: X509Certificate;
  identity: Identity;
}

/** Steps 1 and 2 (the chain, not the validity period) and the identity of this cluster; throws with the why. */
export function issuerCertificate(x5c: string, hostCaPem: string, clusterName: string): GrantIssuer {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(Buffer.from(x5c, 'base64url'));
  } catch {
    throw new Error('is not a certificate');
  }
  const caCert = new X509Certificate(hostCaPem);
  if (!cert.checkIssued(caCert) || !cert.verify(caCert.publicKey)) throw new Error("was not signed by this cluster's host CA");
  let identity: Identity;
  try {
    identity = identityFromCert(cert.raw);
  } catch (err) {
    throw new Error(`carries no identity (${(err as Error).message})`);
  }
  if (identity.cluster !== clusterName) throw new Error(`is for cluster "${identity.cluster}"`);
  return { cert, identity };
}

/** Step 2's validity period and step 3, for grant `g`: why the issuer may not have signed it, or undefined. */
export function issuerRefusal(issuer: GrantIssuer, g: Pick<E2EGrant, 'iss'>, now: number): string | undefined {
  const { cert, identity: id } = issuer;
  if (now < Date.parse(cert.validFrom) || now > Date.parse(cert.validTo)) {
    return `the grant's issuer certificate is valid from ${cert.validFrom} to ${cert.validTo}`;
  }
  if (id.kind !== 'host' || !id.roles.includes(ISSUER_ROLE)) {
    return `the grant's issuer certificate is a ${id.kind} certificate of ${id.name} with roles ${id.roles.join(', ') || 'none'}, not a Proxy's`;
  }
  if (id.name !== g.iss) return `the grant names Proxy ${g.iss}, its certificate names ${id.name}`;
  return undefined;
}

/** Steps 1 to 3 at once (no cache): the issuer certificate to verify the grant with, or why not. */
export function checkGrantIssuer(g: Pick<E2EGrant, 'iss' | 'x5c'>, hostCaPem: string, clusterName: string, now: number): { ok: true; cert: X509Certificate } | { ok: false; why: string } {
  if (g.x5c === undefined) return { ok: false, why: "the grant carries no issuer certificate (x5c): a Proxy of an earlier version signed it" };
  let issuer: GrantIssuer;
  try {
    issuer = issuerCertificate(g.x5c, hostCaPem, clusterName);
  } catch (err) {
    return { ok: false, why: `the grant's issuer certificate ${(err as Error).message}` };
  }
  const why = issuerRefusal(issuer, g, now);
  return why ? { ok: false, why } : { ok: true, cert: issuer.cert };
}
