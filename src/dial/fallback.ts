/**
 * When a client of the cluster's TLS (the agent's tunnel and API calls, gwsh, gwctl) goes through the transport
 * that survives a TLS-inspecting proxy (upgrade.ts): decided here and nowhere else.
 *
 *   TLS straight to the address (the one port), as always
 *   ├─ it works, or fails for any reason but inspection ─► that, unchanged
 *   └─ GW_ERR_TLS_INSPECTED (tlsverify.ts: through a proxy, a certificate another CA issued)
 *      ├─ an operator's root (GATEWAY_PROXY_CA_FILE, NODE_EXTRA_CA_CERTS, the agent's gateway.proxy_ca_file)
 *      │  vouches for that certificate ─► the same TLS (ALPN, client certificate, cluster CA) inside a WebSocket
 *      │  upgrade on the same address; logged once per address and remembered for INSPECTED_MEMORY_MS, so the
 *      │  next dials go there at once
 *      └─ none does ─► GW_ERR_TLS_INSPECTED, whose hint names the root to give
 *
 * The inner TLS is the caller's, verified exactly as on the one port: the inspecting proxy, trusted for the outer
 * TLS only, sees ciphertext. `gateway dial-plan --probe` says which branch a path takes (upgradeVerdict).
 */
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import { X509Certificate } from 'node:crypto';
import { parseAddr, formatHostPort } from '../addr.js';
import { logger } from '../log.js';
import { recordTlsInspected } from '../metrics/dials.js';
import { connectTls, handshakeFailure, type PresentedCert } from '../stream/tls.js';
import type { Dialer } from './dialer.js';
import { chainRoot, issued, tlsVerifyError, type TlsPeer } from './tlsverify.js';
import { openUpgradeStream, operatorRoots } from './upgrade.js';

/** How long an address found inspected (with a trusted root) is dialled through the upgrade at once. */
export const INSPECTED_MEMORY_MS = 5 * 60_000;

/** Addresses met inspected, with when that is to be checked again (bounded: one entry per Proxy address dialled). */
const inspected = new Map<string, number>();
const MAX_REMEMBERED = 256;

export interface ClusterTlsOptions {
  /** Who answers at the address, for the errors (src/dial/tlsverify.ts). */
  peer: Omit<TlsPeer, 'address'>;
  /** The cluster's host CA (PEM), for the outer TLS when no inspection is in the way after all. */
  clusterCa?: string | readonly string[];
  signal?: AbortSignal;
  /** Where the upgrade is served: the Proxy's web address (the address itself unless said: a separate listener's is not). */
  webAddress?: string;
  /**
   * Bytes written on the stream before the TLS starts, whichever path it takes (an end-to-end stream's grant line,
   * src/tunnel/e2e.ts: the Proxy routes it by that line, ahead of a TLS it does not terminate).
   */
  preface?: Buffer;
}

/** Whether one of roots vouches for the chain a proxy presented: it is in the chain, or it issued one of it. */
export function rootsTrust(roots: readonly string[], chain: readonly PresentedCert[]): boolean {
  const cas = roots.flatMap((pem) => {
    try {
      return [new X509Certificate(pem)];
    } catch {
      return [];
    }
  });
  return chain.some((c) => cas.some((ca) => ca.fingerprint256 === c.fingerprint256 || issued(ca, c)));
}

/** What the probe says about an inspected path: would the upgrade be used (the operator gave the root) or not. */
export function upgradeVerdict(dialer: Dialer, chain: readonly PresentedCert[]): { root: string | undefined; trusted: boolean } {
  let roots: string[] = [];
  try {
    roots = operatorRoots(dialer);
  } catch {
    // an unreadable file is the dial's error to report; here it simply vouches for nothing
  }
  return { root: chainRoot(chain), trusted: rootsTrust(roots, chain) };
}

function remember(address: string): void {
  if (inspected.size >= MAX_REMEMBERED) inspected.delete(inspected.keys().next().value!);
  inspected.set(address, Date.now() + INSPECTED_MEMORY_MS);
}

function remembered(address: string): boolean {
  const until = inspected.get(address);
  if (until === undefined) return false;
  if (until > Date.now()) return true;
  inspected.delete(address);
  return false;
}

/** Forgets what was learnt (tests). */
export function forgetInspected(): void {
  inspected.clear();
}

/**
 * TLS to a cluster address (a Proxy's one port) as the caller asked, through the Dialer; through the upgrade
 * when a proxy inspects it and the operator trusts that proxy's root. Rejects as connectTls does (the caller
 * classifies), or with GW_ERR_TLS_INSPECTED / GW_ERR_DIAL_UPGRADE_* from the fallback.
 */
export async function connectClusterTls(
  dialer: Dialer,
  address: string,
  tlsOptions: Omit<tls.ConnectionOptions, 'socket'> & { host: string },
  options: ClusterTlsOptions,
): Promise<tls.TLSSocket> {
  const a = parseAddr(address);
  const addr = formatHostPort(a.host, a.port ?? 443);
  const upgraded = async (roots?: string[]) => {
    const stream: Duplex = await openUpgradeStream(dialer, options.webAddress ?? addr, {
      roots: roots ?? operatorRoots(dialer),
      ...(options.clusterCa === undefined ? {} : { clusterCa: options.clusterCa }),
      ...(options.signal ? { signal: options.signal } : {}),
    });
    if (options.preface) stream.write(options.preface);
    return connectTls(stream, tlsOptions);
  };
  if (remembered(addr)) {
    return upgraded().catch((err: unknown) => {
      inspected.delete(addr); // the path changed: the next dial tries the one port first again
      throw err;
    });
  }
  const raw = await dialer.dial(addr, options.signal ? { signal: options.signal } : {});
  if (options.preface) raw.write(options.preface);
  try {
    return await connectTls(raw, tlsOptions);
  } catch (err) {
    raw.destroy();
    const e = tlsVerifyError(err, { address: addr, ...options.peer });
    const chain = handshakeFailure(err)?.chain;
    if (e?.code !== 'GW_ERR_TLS_INSPECTED' || !chain) throw err;
    const roots = operatorRoots(dialer);
    recordTlsInspected(rootsTrust(roots, chain));
    if (!rootsTrust(roots, chain)) throw e;
    remember(addr);
    logger('dial').info(
      { address: addr, inspected_by: chainRoot(chain), proxy: e.details?.proxy },
      `TLS to ${addr} is inspected by ${chainRoot(chain) ?? 'a proxy'}, whose root the operator gave: the cluster's TLS goes inside a WebSocket upgrade on ${addr} (the proxy sees only ciphertext)`,
    );
    return upgraded(roots);
  }
}
