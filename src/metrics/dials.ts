/**
 * Outbound dial metrics: every dial of the one Dialer (src/dial/dialer.ts) by how it went out (direct, through an
 * http, https, socks5 or socks5h proxy, or as a PAC file decided), its outcome (ok, or the error's stable code) and
 * the proxy authentication scheme the proxy's 407 was answered with; the time to connect (until the socket is the
 * caller's: TCP, the proxy's answer, its authentication); and the TLS-inspecting proxies met on the way to a Proxy
 * (src/dial/fallback.ts), by whether the operator trusts their root (then the tunnel goes through the upgrade).
 */
import { ERROR_CODES } from '../errors.js';
import { counter, histogram, metricsEnabled, secondsSince } from './define.js';

const NOTHING = (): void => undefined;

export const DIAL_SCHEMES = ['direct', 'http', 'https', 'socks5', 'socks5h', 'pac'] as const;
export const PROXY_AUTH = ['none', 'basic', 'digest', 'ntlm', 'negotiate'] as const;
const OUTCOMES = ['ok', ...Object.keys(ERROR_CODES)];

const AREA = 'dials';
const dials = counter({
  name: 'gateway_dials_total',
  help: 'Outbound dials, by how they went out (scheme), outcome (ok or the error code) and the proxy authentication scheme answered (none when the proxy asked for none).',
  area: AREA,
  labels: { scheme: DIAL_SCHEMES, outcome: OUTCOMES, auth: PROXY_AUTH },
});
const duration = histogram({
  name: 'gateway_dial_duration_seconds',
  help: 'Time to connect an outbound dial (TCP, the proxy\'s answer and its authentication), by scheme and whether it succeeded.',
  area: AREA,
  labels: { scheme: DIAL_SCHEMES, result: ['ok', 'error'] },
  buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15],
});
const inspected = counter({
  name: 'gateway_dial_tls_inspected_total',
  help: 'TLS to a Proxy found inspected by a proxy on the way, by whether the operator gave its root (trusted: the tunnel went through the upgrade; untrusted: the dial failed with GW_ERR_TLS_INSPECTED).',
  area: AREA,
  labels: { root: ['trusted', 'untrusted'] },
});

/** A dial is starting with scheme; call the result with its outcome (ok with the auth scheme, or the error code). */
export function startDial(scheme: string): (outcome: { ok: true; auth?: string | undefined } | { ok: false; code: string }) => void {
  if (!metricsEnabled()) return NOTHING;
  const t0 = performance.now();
  return (o) => {
    duration.observe({ scheme, result: o.ok ? 'ok' : 'error' }, secondsSince(t0));
    dials.inc({ scheme, outcome: o.ok ? 'ok' : o.code, auth: o.ok ? (o.auth ?? 'none').toLowerCase() : 'none' });
  };
}

export function recordTlsInspected(trusted: boolean): void {
  inspected.inc({ root: trusted ? 'trusted' : 'untrusted' });
}
