// The document representations moved to representations.ts (issue 28: "wire" said nothing of what the file
// holds). coap/observe.ts, which another branch is editing, still imports them from here; this re-export goes
// when its import names representations.js.
export { OBSERVE_FORM_SPLIT, formEtagEquals, observeForm, type DocumentFormat } from './representations.js';
