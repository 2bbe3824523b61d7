/**
 * Whether a grant was signed by a Proxy of this cluster, at whichever Proxy the stream lands on (the contract:
 * src/tunnel/e2e.ts; the prose: docs/tunnels.md, "End-to-end streams: the Proxy"). Behind a load balancer the
 * grant session and the stream are two connections, most often to two Proxies that share no state (agent_mesh
 * Proxies do not talk to each other): so the grant carries its issuer's TLS certificate (x5c) and any Proxy checks
 * it here, the issuer itself included (one path for every Proxy). In this order, the first that fails is the why:
 *
 *   1. the token decodes (decodeGrant) and carries x5c, a certificate (DER, base64url);
 *   2. that certificate was signed by the cluster's host CA and is valid now;
 *   3. its identity (the extension src/auth/pki.ts reads) is a host of this cluster with the role proxy, named
 *      grant.iss: an agent's or the Auth Service's host certificate chains to the same CA, and cannot sign grants;
 *   4. grant.iss is a live Proxy of the cluster now (ClusterView.proxy): a Proxy that left signs no more grants;
 *   5. verifyGrant with that certificate: the signature, not expired, not issued in the future.
 *
 * Steps 1 to 3 are src/auth/grantissuer.ts's (the agent makes them too, for a grant from a Proxy it holds no tunnel
 * to). Steps 2 and 3 follow from the certificate's bytes and the host CA alone: their result is kept by those bytes
 * (at most ISSUER_CACHE_MAX, all forgotten when the host CA changes), as the peering server keeps its peers'. Its
 * validity period, the liveness and the signature are checked every time. Single use is the relay's (e2erelay.ts).
 */
import type { ClusterTrust } from '../auth/proxyauth.js';
import { issuerCertificate, issuerRefusal, ISSUER_ROLE, type GrantIssuer } from '../auth/grantissuer.js';
import { decodeGrant, verifyGrant, type GrantCheck } from '../tunnel/e2e.js';

export { ISSUER_ROLE };
/** Issuer certificates whose chain and identity are remembered; beyond, the cache starts again. */
export const ISSUER_CACHE_MAX = 256;

export interface IssuerOptions {
  trust: Pick<ClusterTrust, 'clusterName' | 'host'>;
  /** Whether a Proxy of this ID is live in the cluster now (ClusterView.proxy). */
  live(proxyId: string): boolean;
}

export class GrantIssuers {
  private readonly known = new Map<string, GrantIssuer>();
  private knownCa: string | undefined;

  constructor(private readonly options: IssuerOptions) {}

  /** Issuer certificates remembered now (at most ISSUER_CACHE_MAX). */
  get cached(): number {
    return this.known.size;
  }

  /** Steps 1 to 5 for a token. */
  check(token: string, now: number): GrantCheck {
    const decoded = decodeGrant(token);
    if (!decoded.ok) return decoded;
    const g = decoded.grant;
    if (g.x5c === undefined) return { ok: false, why: "the grant carries no issuer certificate (x5c): a Proxy of an earlier version signed it" };
    let issuer: GrantIssuer;
    try {
      issuer = this.certificate(g.x5c);
    } catch (err) {
      return { ok: false, why: `the grant's issuer certificate ${(err as Error).message}` };
    }
    const why = issuerRefusal(issuer, g, now);
    if (why) return { ok: false, why };
    if (!this.options.live(g.iss)) return { ok: false, why: `Proxy ${g.iss} is not a live Proxy of this cluster` };
    return verifyGrant(token, issuer.cert, now);
  }

  /** Steps 2 and 3's facts of a certificate (src/auth/grantissuer.ts), from the cache or checked now; throws with the why. */
  private certificate(x5c: string): GrantIssuer {
    const ca = this.options.trust.host.tls.certPem;
    if (ca !== this.knownCa || this.known.size >= ISSUER_CACHE_MAX) {
      this.known.clear();
      this.knownCa = ca;
    }
    // Keyed by the certificate's own text (at most a few KiB, as decodeGrant bounds it): a hit parses nothing.
    const cached = this.known.get(x5c);
    if (cached) return cached;
    const known = issuerCertificate(x5c, ca, this.options.trust.clusterName);
    this.known.set(x5c, known);
    return known;
  }
}
