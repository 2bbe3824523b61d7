/**
 * OpenSSH user-certificate authentication for ssh2 servers (the agents' SSH Service and the Proxy's SSH jump
 * host): ssh2 hands us the certificate blob and the raw signature for "*-cert-v01@openssh.com" keys, and we
 * check the certificate (this cluster's user CA, a user certificate, valid now, optionally a principal) and
 * the signature made with the certified key.
 */
import type { PublicKeyAuthContext } from 'ssh2';
import { parseSshCert, type ParsedSshCert } from './pki.js';
import { blobFromLine, sshVerify } from './pki/sshwire.js';

export type CertCheck = { ok: true; cert: ParsedSshCert; query: boolean } | { ok: false; why: string; cert?: ParsedSshCert };

/**
 * Checks a publickey authentication attempt. principal: the login the certificate must list (undefined: any).
 * query is true when the client only asks whether the key would do (no signature yet).
 */
export function checkUserCertAuth(ctx: PublicKeyAuthContext, userCa: string, now: number, principal?: string): CertCheck {
  if (!ctx.key.algo.endsWith('-cert-v01@openssh.com')) return { ok: false, why: 'a plain key: only cluster user certificates are accepted' };
  let cert: ParsedSshCert;
  try {
    cert = parseSshCert(`${ctx.key.algo} ${ctx.key.data.toString('base64')}`, userCa);
  } catch {
    return { ok: false, why: 'not an OpenSSH certificate' };
  }
  const why =
    cert.signedByCa !== true
      ? 'certificate not signed by this cluster'
      : cert.certType !== 'user'
        ? 'not a user certificate'
        : now < cert.validAfter || now >= cert.validBefore
          ? 'certificate expired or not yet valid'
          : principal !== undefined && !cert.principals.includes(principal)
            ? `login "${principal}" is not allowed by the certificate (allowed: ${cert.principals.filter((p) => !p.startsWith('-gw-no-login')).join(', ') || 'none'})`
            : undefined;
  if (why) return { ok: false, why, cert };
  if (!ctx.signature) return { ok: true, cert, query: true };
  if (!sshVerify(blobFromLine(cert.publicKey).blob, ctx.blob!, ctx.signature)) return { ok: false, why: 'bad signature', cert };
  return { ok: true, cert, query: false };
}
