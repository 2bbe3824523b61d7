/**
 * MD4 (RFC 1320), for one use only: NTLM's password hash, NTOWFv1 = MD4(UTF-16LE(password)), which NTLMv2 keys
 * with HMAC-MD5 (ntlmv2.ts). It is here because Node's crypto cannot be relied on for it: with OpenSSL 3 MD4 lives
 * in the legacy provider, which Node does not load by default (`createHash('md4')` throws
 * "digital envelope routines::unsupported" on Debian 12's Node 20), and loading that provider process-wide
 * (--openssl-legacy-provider) would re-enable every legacy algorithm for the whole gateway. MD4 is broken as a
 * general hash; NTLM's use of it is the protocol's, not a choice made here. Nothing else may call this.
 */

const rotl = (x: number, n: number): number => (x << n) | (x >>> (32 - n));

/** The three rounds on one 16-word block; updates `h` in place. */
function block(h: Uint32Array, x: Uint32Array): void {
  let [a, b, c, d] = [h[0]!, h[1]!, h[2]!, h[3]!];
  const f = (p: number, q: number, r: number) => (p & q) | (~p & r);
  const g = (p: number, q: number, r: number) => (p & q) | (p & r) | (q & r);
  const k = (p: number, q: number, r: number) => p ^ q ^ r;
  const round1 = [3, 7, 11, 19];
  for (let i = 0; i < 16; i++) {
    const t = rotl((a + f(b, c, d) + x[i]!) | 0, round1[i % 4]!);
    [a, b, c, d] = [d, t, b, c];
  }
  const round2 = [3, 5, 9, 13];
  for (let i = 0; i < 16; i++) {
    const word = (i % 4) * 4 + Math.floor(i / 4);
    const t = rotl((a + g(b, c, d) + x[word]! + 0x5a827999) | 0, round2[i % 4]!);
    [a, b, c, d] = [d, t, b, c];
  }
  const round3 = [3, 9, 11, 15];
  const order3 = [0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15];
  for (let i = 0; i < 16; i++) {
    const t = rotl((a + k(b, c, d) + x[order3[i]!]! + 0x6ed9eba1) | 0, round3[i % 4]!);
    [a, b, c, d] = [d, t, b, c];
  }
  h[0] = (h[0]! + a) | 0;
  h[1] = (h[1]! + b) | 0;
  h[2] = (h[2]! + c) | 0;
  h[3] = (h[3]! + d) | 0;
}

/** MD4 of `data`: 16 bytes. */
export function md4(data: Uint8Array): Buffer {
  const bitLength = BigInt(data.length) * 8n;
  const padded = Buffer.alloc((Math.floor((data.length + 8) / 64) + 1) * 64);
  padded.set(data);
  padded[data.length] = 0x80;
  padded.writeBigUInt64LE(bitLength, padded.length - 8);
  const h = new Uint32Array([0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476]);
  const x = new Uint32Array(16);
  for (let off = 0; off < padded.length; off += 64) {
    for (let i = 0; i < 16; i++) x[i] = padded.readUInt32LE(off + i * 4);
    block(h, x);
  }
  const out = Buffer.alloc(16);
  for (let i = 0; i < 4; i++) out.writeUInt32LE(h[i]!, i * 4);
  return out;
}
