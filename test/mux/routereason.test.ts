/** routeReason: why a connection took its route, as a span attribute (src/trace.ts) says it. */
import { describe, expect, it } from 'vitest';
import { routeReason, type ConnInfo } from '../../src/mux/multiplexer.js';

const base: ConnInfo = { remoteAddress: '192.0.2.7', remotePort: 1, localAddress: '192.0.2.1', localPort: 443, route: 'x' };

describe('routeReason', () => {
  it('names the ALPN that chose the route, a TLS route chosen otherwise, plain bytes, and an upgrade', () => {
    expect(routeReason({ ...base, route: 'gateway-proxy-ssh', alpn: 'gateway-proxy-ssh', clientAlpn: ['gateway-proxy-ssh'] })).toBe('ALPN gateway-proxy-ssh');
    expect(routeReason({ ...base, route: 'kube', serverName: 'kube-gateway-proxy-alpn.example.com', clientAlpn: ['h2'] })).toBe('TLS without a chosen ALPN (server name kube-gateway-proxy-alpn.example.com)');
    expect(routeReason({ ...base, route: 'web', clientAlpn: [] })).toBe('TLS without a chosen ALPN');
    expect(routeReason({ ...base, route: 'ssh' })).toBe('first bytes');
    expect(routeReason({ ...base, route: 'gateway-postgres', alpn: 'gateway-postgres', clientAlpn: ['gateway-postgres'], upgraded: true })).toBe('ALPN gateway-postgres (through /webapi/connectionupgrade)');
  });
});
