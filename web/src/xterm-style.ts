/**
 * xterm.js's DOM renderer writes its per-terminal rules (colours, cell size, cursor) into style elements it
 * creates. The page's Content-Security-Policy (style-src 'self', no 'unsafe-inline') refuses those. The build
 * (web/build/xterm-csp.ts) makes xterm create gw-xterm-style elements instead; this element keeps the text
 * xterm writes in a constructed stylesheet adopted by the document: rules set through the CSSOM from our own
 * script, which the policy allows, and no inline style anywhere.
 */

export const TAG = 'gw-xterm-style';

export function defineXtermStyle(): void {
  if (customElements.get(TAG)) return;
  class XtermStyle extends HTMLElement {
    readonly sheet = new CSSStyleSheet();
    text = '';
    connectedCallback(): void {
      if (!document.adoptedStyleSheets.includes(this.sheet)) document.adoptedStyleSheets = [...document.adoptedStyleSheets, this.sheet];
    }
    disconnectedCallback(): void {
      document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== this.sheet);
    }
  }
  // xterm sets and reads .textContent: kept as the sheet's rules, never as text in the DOM.
  Object.defineProperty(XtermStyle.prototype, 'textContent', {
    configurable: true,
    get(this: XtermStyle) {
      return this.text;
    },
    set(this: XtermStyle, value: string | null) {
      this.text = value ?? '';
      this.sheet.replaceSync(this.text);
    },
  });
  customElements.define(TAG, XtermStyle);
}
