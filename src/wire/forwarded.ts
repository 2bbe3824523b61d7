/**
 * The headers a Proxy in its own process adds to a request it forwards from its web port to the Auth API
 * (src/client/forward.ts writes them, src/auth/api.ts reads them): the client's verified certificate (base64 DER,
 * absent when it sent none), its address and the host it addressed. The Auth API honours them only when the caller
 * is a Proxy of this cluster, and verifies the certificate again (src/auth/peeridentity.ts forwardedIdentity).
 */
export const FORWARDED = { marker: 'x-gateway-forwarded', cert: 'x-gateway-forwarded-cert', addr: 'x-gateway-forwarded-for', host: 'x-gateway-forwarded-host' } as const;
