/**
 * Certificate expiry: when each certificate this process serves with or trusts as a CA stops being valid, in Unix
 * seconds, by its role (a closed set: not its subject, which may name a host). Read at each scrape from the
 * certificate in use (a renewed one shows at the next scrape); an alert compares it with time() (the shipped rule
 * fires 7 days before). A certificate that cannot be read is left out of the scrape, not guessed.
 */
import { X509Certificate } from 'node:crypto';
import { gauge } from './define.js';

/**
 * host_ca, user_ca: the cluster's certificate authorities (Auth Service); auth_server: the Auth API's certificate;
 * proxy_web: the Proxy's web certificate (issued by the cluster or the operator's https_keypairs); agent_host: an
 * agent's host certificate (renewed from two thirds of its life on).
 */
export const CERT_ROLES = ['host_ca', 'user_ca', 'auth_server', 'proxy_web', 'agent_host'] as const;
export type CertRole = (typeof CERT_ROLES)[number];

const sources = new Map<CertRole, Set<() => string | undefined>>();
/** The last certificate parsed and its expiry, so that a scrape parses only a certificate that changed. */
const parsed = new Map<string, number>();

const expiry = gauge({
  name: 'gateway_certificate_expiry_timestamp_seconds',
  help: 'When a certificate in use stops being valid (Unix seconds), by role; the soonest when several of one role are in use.',
  area: 'certificates',
  labels: { role: CERT_ROLES },
  collect: () => {
    expiry.metric.reset();
    for (const [role, reads] of sources) {
      let soonest: number | undefined;
      for (const read of reads) {
        const at = expiresAt(read());
        if (at !== undefined && (soonest === undefined || at < soonest)) soonest = at;
      }
      if (soonest !== undefined) expiry.set({ role }, soonest);
    }
  },
});

function expiresAt(pem: string | undefined): number | undefined {
  if (!pem) return undefined;
  const known = parsed.get(pem);
  if (known !== undefined) return known;
  let at: number;
  try {
    at = Math.floor(Date.parse(new X509Certificate(pem).validTo) / 1000);
  } catch {
    return undefined;
  }
  if (parsed.size >= 64) parsed.clear();
  parsed.set(pem, at);
  return at;
}

/** read gives the PEM of the certificate in use for role (undefined: none now). Returns the unregister. */
export function watchCertificate(role: CertRole, read: () => string | undefined): () => void {
  let reads = sources.get(role);
  if (!reads) sources.set(role, (reads = new Set()));
  reads.add(read);
  return () => reads.delete(read);
}
