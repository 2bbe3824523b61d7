/**
 * `gateway dial-plan --probe`: dials a target the way every client does (the Dialer: the same proxy, the same
 * NO_PROXY) and opens TLS to it, to report what answers on that path: the certificate's subject and issuer, the
 * CA at the top of its chain, and, when the cluster's CA is known, whether the certificate is the cluster's or
 * "inspected by <CA>" (the judgement is tlsverify.ts probeVerdict, the one that names refused certificates).
 *
 * The probe reads the certificate without trusting it and sends nothing but its ClientHello (no client
 * certificate, no request); the connection is closed once the handshake is done. On an inspected path it also
 * says whether the operator's roots vouch for the inspecting proxy, i.e. whether the upgrade would be used. Everything, the dial through
 * the proxy and the handshake, fits in one deadline.
 */
import { formatHostPort } from '../addr.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { connectTls, presentedChain, type PresentedCert } from '../stream/tls.js';
import { dialRoute, type DialRoute, type Dialer } from './dialer.js';
import { parseTarget } from './select.js';
import { upgradeVerdict } from './fallback.js';
import { probeVerdict, type ProbeVerdict } from './tlsverify.js';

export const PROBE_TIMEOUT_MS = 10_000;

export interface ProbeResult {
  /** host:port dialled. */
  address: string;
  route: DialRoute | undefined;
  /** The chain presented, leaf first (empty when the probe failed before the handshake ended). */
  chain: PresentedCert[];
  verdict: ProbeVerdict;
  /**
   * When the path is inspected: whether a root the operator gave vouches for the inspecting proxy, so that the
   * cluster's clients would go through the upgrade transport (src/dial/fallback.ts).
   */
  upgradeTrusted?: boolean;
  /** Why the probe could not finish: the dial's or the handshake's error. */
  error?: GatewayError;
}

export interface ProbeOptions {
  /** The cluster's CA certificates (PEM), to say whether the certificate is the cluster's. */
  clusterCas?: readonly string[];
  timeoutMs?: number;
}

/** Probes target (host:port or an https:// URL); never throws for a failed dial or handshake (it is in .error). */
export async function probeTls(dialer: Dialer, target: string, options: ProbeOptions = {}): Promise<ProbeResult> {
  const t = parseTarget(target);
  const address = formatHostPort(t.host, t.port);
  const timeoutMs = options.timeoutMs ?? PROBE_TIMEOUT_MS;
  const started = Date.now();
  const empty = (error: GatewayError, route?: DialRoute): ProbeResult => ({
    address,
    route,
    chain: [],
    verdict: { cluster: undefined, root: undefined, inspectedBy: undefined },
    error,
  });
  let raw;
  try {
    raw = await dialer.dial(t, { signal: AbortSignal.timeout(timeoutMs) });
  } catch (err) {
    const e = toGatewayError(err);
    return empty(e.code === 'GW_ERR_DIAL_ABORTED' ? new GatewayError('GW_ERR_DIAL_CONNECT_TIMEOUT', `the probe of ${address} could not dial it within ${timeoutMs} ms`) : e);
  }
  const route = dialRoute(raw);
  try {
    const socket = await connectTls(raw, {
      host: t.host,
      port: t.port,
      rejectUnauthorized: false,
      handshakeTimeoutMs: Math.max(1, timeoutMs - (Date.now() - started)),
    });
    const chain = presentedChain(socket.getPeerCertificate(true));
    socket.destroy();
    const verdict = probeVerdict(chain, options.clusterCas ?? [], route);
    return { address, route, chain, verdict, ...(verdict.inspectedBy ? { upgradeTrusted: upgradeVerdict(dialer, chain).trusted } : {}) };
  } catch (err) {
    raw.destroy();
    const e =
      err instanceof GatewayError
        ? err
        : new GatewayError('GW_ERR_DIAL_PROBE_FAILED', `the probe reached ${address} but TLS with it failed: ${err instanceof Error ? err.message : String(err)}`, {
            cause: err,
            details: { address, proxy: route?.proxy?.display ?? null },
          });
    return empty(e, route);
  }
}
