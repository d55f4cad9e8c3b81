package policy

import (
	"strings"
	"unicode"
)

// codecNames are the names Python's codecs.lookup finds, but latin-1's (CPython 3.11's
// encodings.aliases and the modules of the encodings package), each lowercased with every character
// but letters and digits left out. _codecs.encode(s, name) with one of them makes bytes the guard,
// which reads s as latin-1, does not see (cp037 of a str is another byte string than its latin-1).
var codecNames = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Fields(
		"037 1026 1125 1140 1250 1251 1252 1253 1254 1255 1256 1257 1258 273 424 437 500 646 775 850 852 " +
			"855 857 858 860 861 862 863 864 865 866 869 932 936 949 950 ansi ansix341968 ansix341986 arabic " +
			"ascii asmo708 base64 base64codec big5 big5hkscs big5tw bz2 bz2codec charmap chinese cp037 cp1006 " +
			"cp1026 cp1051 cp1125 cp1140 cp1250 cp1251 cp1252 cp1253 cp1254 cp1255 cp1256 cp1257 cp1258 " +
			"cp1361 cp154 cp273 cp367 cp424 cp437 cp500 cp65001 cp720 cp737 cp775 cp850 cp852 cp855 cp856 " +
			"cp857 cp858 cp860 cp861 cp862 cp863 cp864 cp865 cp866 cp866u cp869 cp874 cp875 cp932 cp936 cp949 " +
			"cp950 cpgr cpis csascii csbig5 cshproman8 csibm037 csibm1026 csibm273 csibm424 csibm500 csibm855 " +
			"csibm857 csibm858 csibm860 csibm861 csibm863 csibm864 csibm865 csibm866 csibm869 csiso2022jp " +
			"csiso2022kr csiso58gb231280 csisolatin2 csisolatin3 csisolatin4 csisolatin5 csisolatin6 " +
			"csisolatinarabic csisolatincyrillic csisolatingreek csisolatinhebrew cskoi8r cspc775baltic " +
			"cspc850multilingual cspc862latinhebrew cspc8codepage437 cspcp852 csptcp154 csshiftjis cyrillic " +
			"cyrillicasian dbcs ebcdiccpbe ebcdiccpca ebcdiccpch ebcdiccphe ebcdiccpnl ebcdiccpus ebcdiccpwt " +
			"ecma114 ecma118 elot928 euccn eucgb2312cn eucjis2004 eucjisx0213 eucjp euckr gb18030 gb180302000 " +
			"gb2312 gb23121980 gb231280 gbk greek greek8 hebrew hex hexcodec hkscs hproman8 hz hzgb hzgb2312 " +
			"ibm037 ibm039 ibm1026 ibm1051 ibm1125 ibm1140 ibm273 ibm367 ibm424 ibm437 ibm500 ibm775 ibm850 " +
			"ibm852 ibm855 ibm857 ibm858 ibm860 ibm861 ibm862 ibm863 ibm864 ibm865 ibm866 ibm869 idna " +
			"iso2022jp iso2022jp1 iso2022jp2 iso2022jp2004 iso2022jp3 iso2022jpext iso2022kr iso646irv1991 " +
			"iso646us iso8859 iso885910 iso8859101992 iso885911 iso8859112001 iso885913 iso885914 " +
			"iso8859141998 iso885915 iso885916 iso8859162001 iso88592 iso885921987 iso88593 iso885931988 " +
			"iso88594 iso885941988 iso88595 iso885951988 iso88596 iso885961987 iso88597 iso885971987 iso88598 " +
			"iso885981988 iso88599 iso885991989 isoceltic isoir101 isoir109 isoir110 isoir126 isoir127 " +
			"isoir138 isoir144 isoir148 isoir157 isoir166 isoir199 isoir226 isoir58 isoir6 jisx0213 johab " +
			"koi8r koi8t koi8u korean ksc5601 ksc56011987 ksx1001 kz1048 l10 l2 l3 l4 l5 l6 l7 l8 l9 latin10 " +
			"latin2 latin3 latin4 latin5 latin6 latin7 latin8 latin9 macarabic maccenteuro maccentraleurope " +
			"maccroatian maccyrillic macfarsi macgreek maciceland macintosh maclatin2 macroman macromanian " +
			"macturkish mbcs ms1361 ms932 ms936 ms949 ms950 mskanji oem palmos pt154 ptcp154 punycode quopri " +
			"quopricodec quotedprintable r8 rawunicodeescape rk1048 roman8 rot13 ruscii shiftjis shiftjis2004 " +
			"shiftjisx0213 sjis sjis2004 sjisx0213 strk10482002 thai tis620 tis6200 tis62025290 tis62025291 " +
			"u16 u32 u7 u8 uhc ujis undefined unicode11utf7 unicodebigunmarked unicodeescape " +
			"unicodelittleunmarked us usascii utf utf16 utf16be utf16le utf32 utf32be utf32le utf7 utf8 " +
			"utf8sig utf8ucs2 utf8ucs4 uu uucodec windows1250 windows1251 windows1252 windows1253 windows1254 " +
			"windows1255 windows1256 windows1257 windows1258 xmacjapanese xmackorean xmacsimpchinese " +
			"xmactradchinese zip zlib zlibcodec") {
		m[n] = true
	}
	return m
}()

// isOtherCodec reports whether s names a codec other than latin-1, as codecs.lookup would take it.
func isOtherCodec(s []byte) bool {
	if len(s) > 32 {
		return false
	}
	var b strings.Builder
	for _, r := range strings.ToLower(string(s)) {
		if r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
		}
	}
	return codecNames[b.String()]
}
